"""The schema check against hand-built cases: what describes some value passes (recursion
through a property, an anyOf with a way out, a long $ref chain ending in a type), what only
leads back to itself is a 400; no recursion however long the chain."""
import pytest

from freetoken.server.errors import BadRequest
from freetoken.server.schema_check import MAX_ENUM, check_schema

CHAIN = {"$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(20000)},
                   "d20000": {"type": "string"}}, "$ref": "#/$defs/d0"}
RING = {"$defs": {f"d{i}": {"$ref": f"#/$defs/d{(i + 1) % 20000}"} for i in range(20000)}, "$ref": "#/$defs/d0"}


@pytest.mark.parametrize("schema", [
    None, True, {"type": "object", "properties": {"next": {"$ref": "#"}}},
    {"anyOf": [{"$ref": "#"}, {"type": "null"}]}, {"oneOf": [{"$ref": "#/$defs/a"}, {"type": "string"}],
                                                  "$defs": {"a": {"$ref": "#"}}},
    {"$ref": "#/$defs/a~1b", "$defs": {"a/b": {"type": "integer"}}}, {"enum": list(range(MAX_ENUM))}, CHAIN,
    # required recursion with a way out: a null, an optional property, an empty array
    {"type": "object", "properties": {"n": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["n"]},
    {"type": ["object", "null"], "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"],
     "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/A"}}}}}])
def test_schemas_that_describe_a_value_pass(schema):
    check_schema(schema, "s")


@pytest.mark.parametrize("schema", [
    {"$ref": "#"}, {"allOf": [{"type": "object"}, {"$ref": "#"}]}, {"anyOf": [{"$ref": "#"}, {"$ref": "#"}]},
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
     "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
    {"enum": list(range(MAX_ENUM + 1))}, RING, [1],
    # issue 36: a $ref cycle through `required` (a requires b, b requires a) describes no finite value
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"],
     "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}, "required": ["b"]},
               "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}}},
    {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
    {"type": "array", "minItems": 1, "items": {"$ref": "#"}}])
def test_schemas_that_describe_nothing_are_400(schema):
    with pytest.raises(BadRequest) as e:
        check_schema(schema, "response_format.json_schema.schema")
    assert e.value.param == "response_format.json_schema.schema"
