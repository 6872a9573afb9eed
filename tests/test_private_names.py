"""No package reaches a private name of another: neither `from other.module import _name`
nor `obj._name` on an object that is not `self`/`cls` (a private attribute is the owner's to
change; a caller that needs it needs a public method). Third-party objects are outside this rule
only where named below with the reason."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "freetoken"
# (file, attribute): a library's private name we must call, with why
ALLOWED = {
    ("server/replicas/frontend.py", "_init"): "Ray Serve's DeploymentHandle makes its router only on first use",
}


def _package(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _target_package(f: Path, node: ast.ImportFrom) -> str | None:
    if node.level:
        base = list(f.relative_to(ROOT).parts[:-1])
        base = base[:len(base) - (node.level - 1)]
        parts = base + (node.module.split(".") if node.module else [])
    elif node.module and node.module.split(".")[0] == "freetoken":
        parts = node.module.split(".")[1:]
    else:
        return None
    return parts[0] if parts else ""


def violations() -> list[str]:
    out = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT)
        tree = ast.parse(f.read_text(), str(f))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _target_package(f, node)
                if target is not None and target != _package(rel):
                    out += [f"{rel}:{node.lineno}: imports {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                if (str(rel), node.attr) in ALLOWED:
                    continue
                out.append(f"{rel}:{node.lineno}: reads {ast.unparse(owner)}.{node.attr}")
    return out


def test_no_package_reaches_a_private_name():
    found = violations()
    assert not found, "private names used from outside their owner:\n" + "\n".join(found)


# --- above the engine: the EngineClient protocol is the whole surface --------------------------
# The server, LLM, the CLI, the simulators and the benchmarks hold engines; tests/ stay exempt.
REPO = ROOT.parent
ABOVE_THE_ENGINE = ("freetoken/server/**/*.py", "freetoken/llm.py", "freetoken/cli/**/*.py", "freetoken/sim/**/*.py",
                    "bench/*.py")
# (file, name): an object called `engine` there that is not an engine client, with why
NOT_AN_ENGINE = {
    ("freetoken/server/replicas/frontend.py", "_init"): "its `engine` is a Ray Serve DeploymentHandle to the replicas",
    ("freetoken/server/replicas/frontend.py", "options"): "its `engine` is a Ray Serve DeploymentHandle to the replicas",
}
# (file, name): a benchmark that measures an engine part itself, which no option reaches, with why
WHITE_BOX = {
    ("bench/gpu_check.py", "runner"): "the dry run swaps the decode graphs' capture for the eager one and the "
                                      "check reads their replay counters",
    ("bench/gpu_check.py", "model"): "prefill with the offload backend's whole-layer streamer on vs off",
    ("bench/deepseek_v4_decode.py", "model"): "the bytes a decode token reads, from the model's own tensors",
    ("bench/concurrent_streams.py", "runner"): "labels its rows with the bf16_dot the model's calibration chose",
    ("bench/speculative.py", "spec"): "the verify-cost curve forces drafts of each length k through the "
                                      "speculator and reads its price's prediction",
    ("bench/verify_cost.py", "spec"): "forces random drafts of each length k through the speculator to time "
                                      "verify steps in CPU time",
    ("bench/speculative.py", "runner"): "--routing-trace: the verify probe (engine/verify_probe.py) timed again once "
                                        "the trace routes, its forwards on a scratch sequence outside the scheduler",
    ("bench/speculative.py", "blocks"): "--routing-trace: the verify probe's scratch sequence takes its KV blocks and "
                                        "gives them back",
    ("bench/speculative.py", "model"): "--routing-trace routes the loaded model's MoE layers as a real model's "
                                       "trace (sim/trace_routing.py), which no serving option does",
    ("bench/spec_lockstep.py", "scheduler"): "plain and speculative requests of one engine step in turn: the other "
                                             "is parked outside the running list (the never-slower lockstep)",
    ("bench/spec_lockstep.py", "spec"): "the speculator attached for the speculative side's steps only",
    ("bench/spec_lockstep.py", "seqs"): "the parked request's sequence, to put it back in the running list",
    ("bench/spec_mtp.py", "spec"): "forces MTP drafts of each length k through the speculator, timing the "
                                   "drafter and the verify apart",
    ("bench/spec_mtp.py", "runner"): "a fresh MTP drafter over the model's nextn layer for each k",
    ("bench/llamacpp_dump.py", "model"): "records the layers' inputs and outputs to compare each op with llama.cpp's "
                                         "graph tensors, which no serving option exposes",
    ("bench/gguf_types_memory.py", "model"): "the expert pool's own bytes, compared with the file's expert bytes",
    ("bench/disk_hits.py", "model"): "the MoE layer calls of the resident and the disk-tier expert backends "
                                    "alone, on the same inputs (the tier's overhead at hits)",
    ("bench/scripted_server.py", "getattr"): "ForcedEngine forwards EngineClient's names only (client_names())",
}


def _client_surface() -> set[str]:
    from freetoken.engine.client import client_names
    return set(client_names())


def _engine_names(tree: ast.AST) -> set[str]:
    """`engine`, and local names bound to an engine expression (`eng = self.svc.engine`)."""
    names = {"engine"}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and _is_engine(node.value, {"engine"})):
            names.add(node.targets[0].id)
    return names


def _is_engine(node: ast.AST, names: set[str]) -> bool:
    return (isinstance(node, ast.Name) and node.id in names) or (isinstance(node, ast.Attribute) and node.attr == "engine")


def reaches_in(tree: ast.AST, rel: str) -> list[str]:
    """Every name read on an engine object (`x.engine.NAME`, `engine.NAME`, `getattr(engine, ...)`)
    that the EngineClient protocol does not declare."""
    surface, names, out = _client_surface(), _engine_names(tree), []
    excused = NOT_AN_ENGINE.keys() | WHITE_BOX.keys()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_engine(node.value, names):
            if node.attr not in surface and (rel, node.attr) not in excused:
                out.append(f"{rel}:{node.lineno}: reads {ast.unparse(node)} (not in EngineClient)")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and node.args and _is_engine(node.args[0], names)
              and (rel, node.func.id) not in excused):
            out.append(f"{rel}:{node.lineno}: probes the engine with {ast.unparse(node)}")
    return out


def _above_the_engine() -> list[Path]:
    return sorted({f for pattern in ABOVE_THE_ENGINE for f in REPO.glob(pattern)})


def test_code_above_the_engine_uses_only_the_engine_client_surface():
    files = _above_the_engine()
    assert {f.relative_to(REPO).parts[0] for f in files} == {"freetoken", "bench"} and len(files) > 40
    found = [line for f in files for line in reaches_in(ast.parse(f.read_text(), str(f)), str(f.relative_to(REPO)))]
    assert not found, ("code above the engine reaches past EngineClient (add what it needs to "
                       "engine/client.py and LLMEngine):\n" + "\n".join(found))


def test_every_excuse_is_still_needed():
    """An entry of NOT_AN_ENGINE / WHITE_BOX whose file no longer reads that name is stale."""
    used = set()
    for f in _above_the_engine():
        rel = str(f.relative_to(REPO))
        tree = ast.parse(f.read_text(), str(f))
        names = _engine_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_engine(node.value, names):
                used.add((rel, node.attr))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args \
                    and _is_engine(node.args[0], names):
                used.add((rel, node.func.id))
    stale = (NOT_AN_ENGINE.keys() | WHITE_BOX.keys()) - used
    assert not stale, f"excused reaches no file makes any more: {sorted(stale)}"


def test_the_reach_check_sees_a_reach():
    """The check above flags each kind of reach it is meant to (so its empty result means something)."""
    src = ("def f(svc, engine):\n    svc.engine.scheduler.on_preempt = 1\n    getattr(engine, 'blocks', None)\n"
           "    eng = svc.engine\n    eng.prefix\n    engine.step()\n    svc.engine.kv_usage()\n")
    found = reaches_in(ast.parse(src), "freetoken/server/x.py")
    assert len(found) == 3
    assert "svc.engine.scheduler" in found[0] + found[1] + found[2] and any("eng.prefix" in f for f in found)
    assert any("getattr(engine, 'blocks', None)" in f for f in found)


def test_the_reach_check_sees_reaches_above_the_server():
    """LLM, the CLI and the benchmarks are checked the same way; an excuse covers its own file only."""
    src = ("def f(llm):\n    llm.engine.seqs['r']\n    e = llm.engine\n    e.runner.kv_nbytes\n"
           "    llm.engine.kv_usage()\n    getattr(llm.engine, 'prefix')\n")
    for rel in ("freetoken/llm.py", "freetoken/cli/check.py", "freetoken/sim/sessions/cli.py", "bench/x.py"):
        found = reaches_in(ast.parse(src), rel)
        assert len(found) == 3, (rel, found)
        assert any("llm.engine.seqs" in f for f in found) and any("e.runner" in f for f in found)
    assert len(reaches_in(ast.parse(src), "bench/gpu_check.py")) == 2          # its runner excused, not seqs
