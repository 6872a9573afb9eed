"""Checks on a request's JSON schema before llguidance compiles it (response_format, a forced
tool's parameters): references that never reach a value (`{"$ref": "#"}`, two `$defs` naming
each other, an `anyOf` whose every branch leads back) compile to a grammar that accepts
nothing, and the request would answer 200 with empty content; a huge `enum` costs compile
time on every such request. Both are a 400 naming the place. An object that requires a
property whose schema leads back to the object (`a` requires `b`, `b` requires `a`) counts
too: no finite value satisfies it. What this walk cannot see ends the output with
finish_reason "constraint_failed" (generation.py), never "stop". Iterative walks: the request chooses the depth."""
from __future__ import annotations

from urllib.parse import unquote

from .errors import BadRequest

MAX_ENUM = 4096


def _children(node):
    if isinstance(node, dict):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, list):
        return [(str(i), v) for i, v in enumerate(node)]
    return []


def _pointer(root, ref: str):
    """The node a local `#/a/b` reference names, or None (remote refs and anchors: llguidance's)."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def check_schema(schema, where: str) -> None:
    if not isinstance(schema, dict):
        if schema is None or isinstance(schema, bool):
            return
        raise BadRequest(f"{where}: a JSON schema is an object, got {type(schema).__name__}", param=where)
    paths: dict[int, str] = {}
    stack = [(schema, "#")]
    while stack:                                   # every node once: its pointer, enum sizes
        node, path = stack.pop()
        if id(node) in paths:
            continue
        paths[id(node)] = path
        if isinstance(node, dict) and isinstance(node.get("enum"), list) and len(node["enum"]) > MAX_ENUM:
            raise BadRequest(f"{where}: enum at {path} has {len(node['enum'])} values; at most {MAX_ENUM}",
                             param=where)
        stack.extend((v, f"{path}/{k}") for k, v in _children(node) if isinstance(v, (dict, list)))
    _check_grounded(schema, paths, where)


def _clauses(root, node) -> list[list]:
    """What `node` needs without consuming any JSON, as clauses (each: one of these schemas
    describes a value): its $ref target and every allOf member alone, one of its anyOf, one
    of its oneOf. Unresolvable refs and non-object members are llguidance's to judge."""
    out = []
    ref = node.get("$ref")
    target = _pointer(root, ref) if isinstance(ref, str) else None
    if isinstance(target, dict):
        out.append([target])
    members = node.get("allOf")
    if isinstance(members, list):
        out.extend([m] for m in members if isinstance(m, dict))
    for key in ("anyOf", "oneOf"):
        alts = node.get(key)
        if isinstance(alts, list) and alts and all(isinstance(m, dict) for m in alts):
            out.append(list(alts))
    out += _content_clauses(node)
    return out


def _only(node, kind: str) -> bool:
    """The node's `type` admits only `kind` (no other type could satisfy it instead)."""
    t = node.get("type")
    return t == kind or (isinstance(t, list) and t == [kind])


def _content_clauses(node) -> list[list]:
    """What a value of an object-only or array-only schema must contain: each required
    property's schema (issue 36: `a` requires `b`, `b` requires `a` describes no finite
    value), and the items of an array with minItems >= 1."""
    out = []
    if _only(node, "object"):
        props = node.get("properties")
        req = node.get("required")
        if isinstance(props, dict) and isinstance(req, list):
            out += [[props[k]] for k in req if isinstance(k, str) and isinstance(props.get(k), dict)]
    elif _only(node, "array"):
        need = node.get("minItems")
        need = need if isinstance(need, int) and not isinstance(need, bool) else 0
        prefix = node.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        out += [[m] for m in prefix[:need] if isinstance(m, dict)]
        items = node.get("items")
        if need > len(prefix) and isinstance(items, dict):
            out.append([items])
    return out


def _check_grounded(root, paths: dict[int, str], where: str) -> None:
    """Which schemas describe some finite value, found as Horn clauses are solved (linear, no
    recursion): a schema with no clause does; one whose every clause has a member that does,
    does too. The root must."""
    nodes = {id(root): root}
    stack = [root]
    while stack:
        for _, v in _children(stack.pop()):
            if isinstance(v, (dict, list)) and id(v) not in nodes:
                nodes[id(v)] = v
                stack.append(v)
    pending: dict[int, int] = {}                 # node -> clauses not yet satisfied
    needed_by: dict[int, list] = {}              # member -> [(node, clause)]
    done_clause: set = set()
    grounded = []
    for n in nodes.values():
        if not isinstance(n, dict):
            continue
        cl = _clauses(root, n)
        pending[id(n)] = len(cl)
        for c_i, members in enumerate(cl):
            for m in members:
                needed_by.setdefault(id(m), []).append((id(n), c_i))
        if not cl:
            grounded.append(id(n))
    good = set(grounded)
    while grounded:
        m = grounded.pop()
        for n, c_i in needed_by.get(m, ()):
            if (n, c_i) in done_clause:
                continue
            done_clause.add((n, c_i))
            pending[n] -= 1
            if pending[n] == 0 and n not in good:
                good.add(n)
                grounded.append(n)
    if id(root) not in good:
        stuck = sorted(paths[i] for i in pending if i not in good and ("$ref" in nodes[i] or "required" in nodes[i]))[:4]
        raise BadRequest(f"{where}: the schema describes no value: its $ref/allOf/anyOf/oneOf or "
                         f"required properties lead only back to themselves ({', '.join(stuck) or '#'}); "
                         "a schema must describe finite JSON", param=where)
