"""What drf-spectacular's schema needs beyond the serializers (``SPECTACULAR_SETTINGS``)."""

from __future__ import annotations

from typing import Any


def closed_objects(result: dict[str, Any], generator: Any, request: Any, public: Any) -> Any:
    """Every object with named fields says it has no others (``additionalProperties: false``).

    That is what the API does: a request body with a field its schema does not name is a 400
    naming it ("unknown field; allowed: ..."), and every answer carries exactly the fields of
    its serializer. Objects whose keys are data (a ``DictField``, such as ``env``) keep their
    own ``additionalProperties``. Checked by tests/portal/test_api_schema_conformance.py.
    """
    for component in result.get("components", {}).get("schemas", {}).values():
        if component.get("type") == "object" and "properties" in component:
            component.setdefault("additionalProperties", False)
    return result
