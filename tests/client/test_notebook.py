"""The README's notebook example is clients/python/examples/hello.ipynb, and it works: run
headless by nbclient in a real IPython kernel on this venv's python against a live portal
(tests/stack.py), its output cells checked."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from stack import PortalStack

from portal.jobs.models import Job
from portal.jobs.selectors import job_log
from portal.tenants.tokens import token_issue

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "clients" / "python" / "examples" / "hello.ipynb"
KERNEL = "gpu-portal-test"
CELL_TIMEOUT_S = 120


def code_cells(notebook: dict[str, Any]) -> list[str]:
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def readme_notebook_block() -> str:
    """The README's Python block that follows its link to the notebook."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split("(clients/python/examples/hello.ipynb)", 1)[1]
    match = re.search(r"```python\n(.*?)```", after, flags=re.DOTALL)
    assert match is not None, "README: no Python block after the notebook's link"
    return match.group(1)


def test_the_readme_notebook_example_is_the_example_notebook_cell_by_cell() -> None:
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))

    assert "\n".join(code_cells(notebook)) + "\n" == readme_notebook_block()
    assert all(not cell.get("outputs") for cell in notebook["cells"])  # stored unexecuted


def text_of(output: dict[str, Any]) -> str:
    if output["output_type"] == "stream":
        return str(output["text"])
    return str(output.get("data", {}).get("text/plain", ""))


def progress_lines(cell: dict[str, Any], widgets: dict[str, Any]) -> list[str]:
    """What the wait cell's progress showed: tqdm's widget text (the last value of its
    models, kept by nbclient in the notebook's metadata) or, without ipywidgets, its line
    on stderr, redrawn after each carriage return."""
    shown: list[str] = []
    for output in cell["outputs"]:
        if output["output_type"] == "stream" and output["name"] == "stderr":
            shown += [part.strip() for part in re.split(r"[\r\n]", output["text"])]
        view = output.get("data", {}).get("application/vnd.jupyter.widget-view+json")
        if view is not None:
            states = widgets["application/vnd.jupyter.widget-state+json"]["state"]
            shown += _widget_texts(states, view["model_id"])
    # tqdm's widget pads with figure spaces (U+2007).
    lines = [line.replace("\u2007", " ") for line in shown]
    return [line for line in lines if line.startswith("job ")]


def _widget_texts(states: dict[str, Any], model_id: str) -> list[str]:
    state = states[model_id]["state"]
    texts = [state["value"]] if isinstance(state.get("value"), str) else []
    for child in state.get("children", []):
        texts += _widget_texts(states, str(child).removeprefix("IPY_MODEL_"))
    return texts


def run_notebook(tmp_path: Path, *, widgets: bool) -> Any:
    """The example notebook executed in a fresh kernel (with or without ipywidgets), and a
    last cell that says which python the kernel ran on."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    if not widgets:  # as in a Jupyter without ipywidgets: tqdm falls back to its text line
        notebook.cells.insert(
            0, nbformat.v4.new_code_cell("import sys; sys.modules['ipywidgets'] = None")
        )
    notebook.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    NotebookClient(
        notebook,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    nbformat.write(notebook, tmp_path / f"executed-widgets-{widgets}.ipynb")  # for a failure
    return notebook


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_example_notebook_submits_waits_with_progress_and_shows_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ipykernel.kernelspec import write_kernel_spec

    # A kernel spec of this test's own, on this venv's python, found before any other.
    write_kernel_spec(tmp_path / "jupyter" / "kernels" / KERNEL)
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("GPU_PORTAL_CONFIG", str(tmp_path / "no-login.json"))
    call_command("seed_demo", stdout=io.StringIO())
    alice = get_user_model().objects.get(username="alice")

    with PortalStack(tmp_path, web=True) as stack:
        assert stack.url is not None
        monkeypatch.setenv("PORTAL_URL", stack.url)
        monkeypatch.setenv("PORTAL_TOKEN", token_issue(user=alice))
        runs = {widgets: run_notebook(tmp_path, widgets=widgets) for widgets in (True, False)}

    jobs = list(Job.objects.filter(name="hello", user=alice).order_by("id"))
    assert len(jobs) == 2
    for (widgets, notebook), job in zip(runs.items(), jobs, strict=True):
        check_outputs(notebook, job, widgets=widgets)


def check_outputs(notebook: Any, job: Job, *, widgets: bool) -> None:
    assert (job.state, job.exit_code) == ("SUCCEEDED", 0)
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    _connect, submit, wait, show, last, probe = cells[-6:]
    assert all(out["output_type"] != "error" for cell in cells for out in cell.outputs)
    assert submit.outputs == []
    # The wait cell: its live line (a widget, or text) ending on the final state; the job.
    lines = progress_lines(wait, notebook.metadata.get("widgets", {}))
    assert lines, wait.outputs
    assert lines[-1].startswith(f"job {job.id} SUCCEEDED · exit 0 · elapsed 0:00:"), lines
    shown_as = {key for out in wait.outputs for key in out.get("data", {})}
    assert ("application/vnd.jupyter.widget-view+json" in shown_as) is widgets
    stderr = "".join(out["text"] for out in wait.outputs if out.get("name") == "stderr")
    assert "IProgress" not in stderr and "Warning" not in stderr, stderr
    (waited,) = [out for out in wait.outputs if out["output_type"] == "execute_result"]
    assert text_of(waited).startswith(f"<Job {job.id} 'hello' SUCCEEDED (exit 0, ran 0:00:")
    # The print: state, exit code and the job's own output, as the portal stored it.
    printed = "".join(text_of(out) for out in show.outputs)
    assert printed.startswith("SUCCEEDED 0 ")
    assert "hi" in printed.splitlines()
    assert printed.removeprefix("SUCCEEDED 0 ").rstrip("\n") == job_log(job=job).rstrip("\n")
    # The last cell: the job's HTML table (and its repr as text).
    (table,) = last.outputs
    assert f"<caption>Job {job.id} · hello</caption>" in table["data"]["text/html"]
    assert ">SUCCEEDED</b>" in table["data"]["text/html"]
    assert text_of(table).startswith(f"<Job {job.id} 'hello' SUCCEEDED (exit 0")
    assert Path(text_of(probe.outputs[0]).strip()) == Path(sys.executable)
