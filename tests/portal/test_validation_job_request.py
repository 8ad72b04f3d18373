"""validate_job_request: every field's checks and the exact messages people read."""

from __future__ import annotations

from typing import Any

import pytest

from portal.jobs.models import GpuKind, JobState
from portal.jobs.services import job_submit
from portal.jobs.testing import make_job, make_node, make_team, make_user
from portal.jobs.validation import (
    MIG_PROFILES_ALLOWED,
    DependencySpec,
    JobRequestError,
    validate_job_request,
)
from portal.policy import scheduler_config
from portal.scheduling.snapshot import load_snapshot
from scheduler.model import GpuRequest, SliceKind

pytestmark = pytest.mark.django_db

IMAGE_HELP = "[registry/]name[:tag][@sha256:digest] with a lower-case name, e.g. python:3.11-slim"
COMMAND_HELP = 'a list of non-empty strings such as ["python", "train.py"], or a shell-like line'


@pytest.fixture
def vision():
    return make_team("vision", limit_units=4.0, max_priority="normal")


@pytest.fixture
def alice(vision):
    return make_user("alice", team=vision)


def valid(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "hello",
        "team": "vision",
        "image": "python:3.11-slim",
        "command": ["python", "-c", "print('hi')"],
        "gpu": {"kind": "mig", "profile": "1g.10gb", "count": 1},
    }
    data.update(changes)
    return data


def errors_of(data: Any, user: Any) -> dict[str, str]:
    with pytest.raises(JobRequestError) as caught:
        validate_job_request(data, user=user)
    return caught.value.errors


def test_it_accepts_the_readme_example_with_defaults(alice, vision):
    request = validate_job_request(valid(), user=alice)

    assert request.name == "hello"
    assert request.team == vision
    assert request.command == ("python", "-c", "print('hi')")
    assert request.gpu == GpuRequest(kind=SliceKind.MIG, count=1, profile="1g.10gb")
    assert request.priority == "normal"
    assert request.preemptible is True
    assert request.time_limit_s is None
    assert dict(request.env) == {}
    assert request.depends_on == ()


def test_it_lists_every_missing_required_field_at_once(alice):
    assert errors_of({}, alice) == {
        "name": "required; allowed: a text of 1 to 128 characters",
        "team": "required; allowed: vision",
        "image": f"required; allowed: {IMAGE_HELP}",
        "command": f"required, must not be empty; allowed: {COMMAND_HELP}",
        "gpu": 'required; an object such as {"kind": "whole", "count": 1}',
    }


def test_it_refuses_unknown_fields_naming_the_allowed_ones(alice):
    assert errors_of(valid(gpus=2), alice) == {
        "gpus": "unknown field; allowed: name, team, image, command, env, gpu, priority, "
        "time_limit_s, preemptible, depends_on, notify"
    }


def test_it_refuses_a_body_that_is_not_an_object(alice):
    assert errors_of(["hello"], alice) == {"request": "must be a JSON object with the job's fields"}


def test_it_refuses_a_name_too_long(alice):
    assert errors_of(valid(name="x" * 129), alice) == {
        "name": "129 characters is too long; allowed: a text of 1 to 128 characters"
    }


def test_it_rejects_a_foreign_team_naming_the_users_teams(alice):
    make_team("nlp")
    assert errors_of(valid(team="nlp"), alice) == {
        "team": "'nlp' is not one of your teams; allowed: vision"
    }


def test_it_tells_a_user_without_teams_whom_to_ask(vision):
    loner = make_user("loner")
    assert errors_of(valid(), loner)["team"] == (
        "'vision' is not one of your teams; you are not a member of any team yet; "
        "ask a site admin to add you"
    )


@pytest.mark.parametrize(
    "image",
    [
        "python:3.11-slim",
        "ubuntu",
        "nvcr.io/nvidia/pytorch:24.05-py3",
        "localhost:5000/team/train:v1",
        "ghcr.io/org/img@sha256:" + "a" * 64,
    ],
)
def test_it_accepts_image_references(alice, image):
    assert validate_job_request(valid(image=image), user=alice).image == image


@pytest.mark.parametrize("image", ["Python:3.11", "python 3.11", "python:", "-bad", "a//b"])
def test_it_refuses_malformed_image_references(alice, image):
    assert errors_of(valid(image=image), alice) == {
        "image": f"{image!r} is not an image reference; allowed: {IMAGE_HELP}"
    }


def test_it_splits_a_shell_like_command_line(alice):
    line = "python -c \"import os; print(os.environ['CUDA_VISIBLE_DEVICES'])\""
    request = validate_job_request(valid(command=line), user=alice)
    assert request.command == (
        "python",
        "-c",
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])",
    )


@pytest.mark.parametrize(
    ("command", "errors"),
    [
        ([], {"command": f"required, must not be empty; allowed: {COMMAND_HELP}"}),
        ("   ", {"command": f"required, must not be empty; allowed: {COMMAND_HELP}"}),
        (
            ["python", ""],
            {"command.1": f"must be a non-empty string; allowed: {COMMAND_HELP}"},
        ),
        (["python", 3], {"command.1": f"must be a non-empty string; allowed: {COMMAND_HELP}"}),
        ({"run": "x"}, {"command": f"must be a list; allowed: {COMMAND_HELP}"}),
        (
            "echo 'unclosed",
            {
                "command": "cannot split into arguments (No closing quotation); "
                f"allowed: {COMMAND_HELP}"
            },
        ),
    ],
)
def test_it_refuses_bad_commands(alice, command, errors):
    assert errors_of(valid(command=command), alice) == errors


def test_it_accepts_env_as_an_object_or_as_lines(alice):
    from_object = validate_job_request(valid(env={"SEED": "1", "_X": ""}), user=alice)
    from_lines = validate_job_request(valid(env="SEED=1\n# note\n\n_X="), user=alice)
    assert dict(from_object.env) == dict(from_lines.env) == {"SEED": "1", "_X": ""}


@pytest.mark.parametrize(
    "key",
    ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "PORTAL_JOB"],
)
def test_it_refuses_reserved_env_keys_naming_them(alice, key):
    assert errors_of(valid(env={key: "0"}), alice) == {
        f"env.{key}": f"{key} is reserved: the portal sets CUDA_VISIBLE_DEVICES, "
        "NVIDIA_VISIBLE_DEVICES, CUDA_MPS_* and PORTAL_* for the job's slice"
    }


def test_it_refuses_bad_env_names_and_values(alice):
    assert errors_of(valid(env={"1X": "a", "my-var": "b", "N": 1}), alice) == {
        "env": "invalid variable name '1X', 'my-var'; allowed: an object of NAME: value "
        "strings, names matching [A-Za-z_][A-Za-z0-9_]*",
        "env.N": 'must be a string (quote numbers, e.g. "1")',
    }
    assert errors_of(valid(env="JUSTAKEY"), alice) == {"env": "line 1 'JUSTAKEY' is not KEY=VALUE"}


@pytest.mark.parametrize(
    ("gpu", "errors"),
    [
        (
            {"kind": "tpu"},
            {"gpu.kind": "unknown kind 'tpu'; allowed: whole, mig, mps"},
        ),
        ({"count": 1}, {"gpu.kind": "required; allowed: whole, mig, mps"}),
        (
            {"kind": "whole", "count": 0},
            {"gpu.count": "0 is out of range; allowed: a whole number from 1 to 64"},
        ),
        (
            {"kind": "whole", "count": 65},
            {"gpu.count": "65 is out of range; allowed: a whole number from 1 to 64"},
        ),
        (
            {"kind": "whole", "count": "two"},
            {"gpu.count": "'two' is not a whole number; allowed: a whole number from 1 to 64"},
        ),
        (
            {"kind": "whole", "count": 2, "min_count": 3},
            {"gpu.min_count": "3 is out of range; allowed: a whole number from 1 to 2"},
        ),
        (
            {"kind": "mig", "count": 1},
            {"gpu.profile": f"required for kind mig; allowed: {MIG_PROFILES_ALLOWED}"},
        ),
        (
            {"kind": "mig", "profile": "9g.99gb"},
            {"gpu.profile": f"unknown MIG profile '9g.99gb'; allowed: {MIG_PROFILES_ALLOWED}"},
        ),
        (
            {"kind": "whole", "profile": "1g.10gb"},
            {"gpu.profile": "only for kind mig (this request is kind whole)"},
        ),
        (
            {"kind": "mps", "model": "NVIDIA A100"},
            {"gpu.model": "only for kind whole (a MIG profile or an MPS share names no model)"},
        ),
        (
            {"kind": "whole", "multi_node": "sometimes"},
            {"gpu.multi_node": "'sometimes' is not a boolean; allowed: true, false"},
        ),
        (
            {"kind": "whole", "cards": 2},
            {
                "gpu.cards": "unknown field; allowed: kind, count, min_count, profile, model, "
                "multi_node"
            },
        ),
        ("2 GPUs", {"gpu": 'must be an object such as {"kind": "whole", "count": 1}'}),
    ],
)
def test_it_refuses_wrong_gpu_requests(alice, gpu, errors):
    assert errors_of(valid(gpu=gpu), alice) == errors


def test_the_mig_profile_list_starts_with_the_smallest():
    assert MIG_PROFILES_ALLOWED.startswith("1g.5gb, 1g.5gb+me, 1g.10gb")


def test_it_normalises_a_mig_profile_and_reads_form_strings(alice):
    gpu = {"kind": "mig", "profile": " 3G.40GB ", "count": "2", "min_count": "1"}
    request = validate_job_request(valid(gpu=gpu, preemptible="off"), user=alice)
    assert request.gpu == GpuRequest(kind=SliceKind.MIG, count=2, min_count=1, profile="3g.40gb")
    assert request.preemptible is False


def test_an_elastic_minimum_equal_to_the_count_is_a_rigid_gang(alice):
    gpu = {"kind": "whole", "count": 2, "min_count": 2, "model": "NVIDIA H100"}
    request = validate_job_request(valid(gpu=gpu), user=alice)
    assert request.gpu == GpuRequest(kind=SliceKind.WHOLE, count=2, model="NVIDIA H100")
    assert request.gpu.min_count == 0  # the core's "rigid"


def test_the_allowed_gpu_kinds_are_the_cores_and_the_job_columns():
    assert [kind.value for kind in SliceKind] == list(GpuKind.values)


@pytest.mark.parametrize(
    "gpu",
    [
        {"kind": "mig", "profile": "3g.40gb", "count": 3, "min_count": 2},
        {"kind": "whole", "count": 2, "model": "NVIDIA H100", "multi_node": True},
        {"kind": "mps", "count": 1},
    ],
)
def test_the_scheduler_sees_exactly_the_request_that_was_validated(alice, gpu, settings):
    # One definition of a GPU request: what validation returns is stored and read back into
    # the pass's snapshot as the same core value.
    request = validate_job_request(valid(gpu=gpu), user=alice)
    job = job_submit(user=alice, request=request)

    loaded = load_snapshot(now=job.submitted_at, config=scheduler_config())

    assert [core.request for core in loaded.snapshot.pending if core.id == str(job.pk)] == [
        request.gpu
    ]


def test_a_profile_the_cluster_lacks_is_refused_with_the_ones_it_has(alice):
    gpu = {"kind": "mig", "profile": "7g.80gb", "count": 1}
    # Before any GPU is registered nothing can be checked (tests/portal/test_submit_cluster_fit.py).
    assert validate_job_request(valid(gpu=gpu), user=alice).gpu.profile == "7g.80gb"
    make_node(gpus=[{"mode": "mig", "profiles": ["1g.10gb"]}])
    assert errors_of(valid(gpu=gpu), alice) == {
        "gpu.profile": "no GPU of this cluster offers MIG 7g.80gb; allowed: 1g.10gb"
    }


def test_it_refuses_a_count_over_the_teams_limit(alice):
    assert errors_of(valid(gpu={"kind": "whole", "count": 5}), alice) == {
        "gpu.count": "over-limit count: 5 x whole GPU = 5 GPU units, above team vision's "
        "limit of 4 units; allowed: at most 4"
    }


def test_it_measures_mig_requests_in_gpu_units(alice):
    # 9 x 3g.40gb = 27/7 = 3.86 units fit a limit of 4; 10 do not.
    ok = {"kind": "mig", "profile": "3g.40gb", "count": 9}
    assert validate_job_request(valid(gpu=ok), user=alice).gpu.count == 9
    assert errors_of(valid(gpu={**ok, "count": 10}), alice) == {
        "gpu.count": "over-limit count: 10 x MIG 3g.40gb = 4.29 GPU units, above team "
        "vision's limit of 4 units; allowed: at most 9"
    }


def test_an_elastic_gang_is_measured_by_its_minimum(alice):
    gpu = {"kind": "whole", "count": 8, "min_count": 4}
    assert validate_job_request(valid(gpu=gpu), user=alice).gpu.minimum == 4
    assert errors_of(valid(gpu={**gpu, "min_count": 5}), alice) == {
        "gpu.min_count": "over-limit count: 5 x whole GPU = 5 GPU units, above team vision's "
        "limit of 4 units; allowed: at most 4"
    }


def test_mps_requests_are_measured_by_the_smallest_share_in_the_cluster(alice):
    gpu = {"kind": "mps", "count": 17}
    # Without MPS GPUs nothing is known, so nothing is refused (the job explains itself).
    assert validate_job_request(valid(gpu=gpu), user=alice).gpu.count == 17
    make_node(gpus=[{"mode": "mps", "shares": 4}] * 5)  # 20 shares of 1/4 on one node
    assert errors_of(valid(gpu=gpu), alice) == {
        "gpu.count": "over-limit count: 17 x MPS share = 4.25 GPU units, above team vision's "
        "limit of 4 units; allowed: at most 16"
    }


def test_it_refuses_a_count_over_the_member_limit(vision, alice):
    vision.member_limit_units = 2.0
    vision.save()
    assert errors_of(valid(gpu={"kind": "whole", "count": 3}), alice) == {
        "gpu.count": "over-limit count: 3 x whole GPU = 3 GPU units, above team vision's "
        "per-member limit of 2 units; allowed: at most 2"
    }


def test_a_team_without_a_limit_takes_any_count(vision, alice):
    vision.limit_units = None
    vision.save()
    assert validate_job_request(valid(gpu={"kind": "whole", "count": 64}), user=alice)


def test_it_refuses_a_priority_above_the_teams_maximum(alice):
    assert errors_of(valid(priority="high"), alice) == {
        "priority": "'high' is above team vision's maximum (normal); allowed: low, normal"
    }
    assert errors_of(valid(priority="urgent"), alice) == {
        "priority": "unknown class 'urgent'; allowed: low, normal"
    }
    assert validate_job_request(valid(priority="low"), user=alice).priority == "low"


def test_the_default_priority_respects_a_low_team_maximum(vision, alice):
    vision.max_priority = "low"
    vision.save()
    assert validate_job_request(valid(), user=alice).priority == "low"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "0 is out of range; allowed: seconds from 1 to 2147483647"),
        (1.5, "1.5 is not a whole number; allowed: seconds from 1 to 2147483647"),
        (True, "True is not a whole number; allowed: seconds from 1 to 2147483647"),
    ],
)
def test_it_refuses_a_bad_time_limit(alice, value, message):
    assert errors_of(valid(time_limit_s=value), alice) == {"time_limit_s": message}


def test_it_accepts_dependencies_on_jobs_of_the_users_teams(alice, vision):
    first = make_job(team=vision, user=alice)
    second = make_job(team=vision, user=alice, state=JobState.FAILED)
    request = validate_job_request(
        valid(depends_on=[{"job": first.pk}, {"job": second.pk, "kind": "after_any"}]),
        user=alice,
    )
    assert request.depends_on == (
        DependencySpec(job_id=first.pk, kind="after_ok"),
        DependencySpec(job_id=second.pk, kind="after_any"),
    )
    from_text = validate_job_request(
        valid(depends_on=f"{first.pk}, {second.pk}:after_any"), user=alice
    )
    assert from_text.depends_on == request.depends_on


def test_it_names_unknown_and_foreign_dependencies(alice):
    nlp = make_team("nlp")
    foreign = make_job(team=nlp, user=make_user("bob", team=nlp))
    assert errors_of(valid(depends_on=[foreign.pk, 999999]), alice) == {
        "depends_on": f"unknown job {foreign.pk}, 999999; allowed: ids of jobs of your teams"
    }


def test_it_refuses_bad_dependency_entries(alice, vision):
    job = make_job(team=vision, user=alice)
    assert errors_of(
        valid(depends_on=[{"job": "x"}, {"job": job.pk, "kind": "after"}, job.pk, job.pk]),
        alice,
    ) == {
        "depends_on.0.job": "'x' is not a whole number; allowed: a job id >= 1",
        "depends_on.1.kind": "unknown kind 'after'; allowed: after_ok, after_any",
        "depends_on.3.job": f"job {job.pk} is listed twice",
    }


def test_it_refuses_after_ok_on_a_job_that_already_failed(alice, vision):
    failed = make_job(team=vision, user=alice, state=JobState.CANCELLED)
    assert errors_of(valid(depends_on=[failed.pk]), alice) == {
        "depends_on": f"job {failed.pk} already ended without success, so an after_ok job "
        "could never start; allowed: after_any, or a job that can still succeed"
    }
