"""Move FreeToken's modules into rooms: `git mv`, every reference rewritten, one commit per room.

Run once by the integrator on the merged tree, from the repository root, on a clean work tree:

    python tools/restructure.py            # apply every room, one commit each
    python tools/restructure.py --dry-run  # print the moves still to do and the unmapped modules
    python tools/restructure.py --check    # after applying: import every module, run the layering test

What one room does, for each (old module -> new module) of its list whose old file is still there:
  1. `git mv` the file (new packages get an `__init__.py` with a one-line docstring);
  2. in every tracked .py file, rewrite the imports by their meaning (the AST): relative imports are
     resolved from the file's old place and written relative to its new place, so a moved file's
     `from ..kernels import x` and a sibling's `from .pool import y` both stay right;
     `from pkg import module` of a moved module is split into the module's new package;
  3. in every tracked text file (code, tests, bench, docs, pyproject, monkeypatch strings), rewrite
     dotted names (`freetoken.experts.pool.ExpertPool`) and paths (`freetoken/experts/pool.py`,
     `experts/pool.py`, `models/experts_backend.cache_choice`);
  4. `git commit` the room.
It is idempotent: a move whose old file is gone is done; a second run finds nothing to do (it still
rewrites stale references to old names that a later merge brought in, where the old name cannot
mean anything else). Where an old module's name becomes a package (`weights/gguf.py` ->
`weights/gguf/reader.py`), a dotted name is rewritten only when what follows is not a module of
the new package.

At the end it lists modules left directly in a folder that was split into rooms and is not on
that folder's list of modules that stay (a module another branch added later): add a move for it
to ROOMS and run again. It also lists folders holding more than MAX_MODULES modules.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = "freetoken"
MAX_MODULES = 15
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".json", ".sh", ".yml", ".yaml", ".c", ".h"}
SELF = Path(__file__).resolve()


@dataclass
class Room:
    name: str                      # the commit says it
    why: str
    moves: list[tuple[str, str]]   # (old dotted module, new dotted module), both under freetoken.
    packages: dict[str, str] = field(default_factory=dict)   # new package -> its docstring


def _in(pkg: str, names: str, old_pkg: str | None = None) -> list[tuple[str, str]]:
    """Moves of `old_pkg.name` (default: the room's parent package) to `pkg.name`; `a:b` renames."""
    old_pkg = old_pkg or pkg.rsplit(".", 1)[0]
    out = []
    for n in names.split():
        old, _, new = n.partition(":")
        out.append((f"{old_pkg}.{old}", f"{pkg}.{new or old}"))
    return out


ROOMS = [
    Room("loading", "models/ keeps architectures only; the wiring that builds a model from a checkpoint "
         "(loader, experts backend, disk layout, convert) gets a package of its own",
         _in("freetoken.loading", "loader experts_backend disk_layout convert", "freetoken.models"),
         {"freetoken.loading": "Building a model from a checkpoint: read config -> model skeleton -> expert pool "
                               "-> experts backend -> attach (models/ holds the architectures it builds)."}),
    Room("experts/memory", "the expert cache and what decides residency, in one room",
         _in("freetoken.experts.memory", "pool slots arc cache decision planner next_layer device_plan pinning "
             "transfer uva"),
         {"freetoken.experts.memory": "Where experts live: the host pool, the slot table and its policies, "
                                      "the cache, one layer's decision, copies and page-locking."}),
    Room("experts/execution", "every way an expert runs (CPU kernels, torch, the tiered and resident backends) "
         "in one room: the CPU expert path is found in one hop",
         _in("freetoken.experts.execution", "cpu host_exec torch_exec numerics tiered resident device_path prefill"),
         {"freetoken.experts.execution": "How routed experts run: the CPU kernels' executor, the torch reference, "
                                         "the resident and tiered backends, the device decode path, prefill."}),
    Room("experts/disk", "the disk tier's files in one room",
         _in("freetoken.experts.disk", "disk:backend disk_pieces:pieces disk_plan:plan host_cache host_rows "
             "disk_integrity:integrity"),
         {"freetoken.experts.disk": "The disk tier: experts read from the model file into a host cache, "
                                    "run on the CPU (backend.py), and its share of the memory plan (plan.py)."}),
    Room("experts/measure", "bandwidth probes, profiles and routing recording in one room",
         _in("freetoken.experts.measure", "bandwidth membw diskbw recording stats trace_format probe"),
         {"freetoken.experts.measure": "Measuring expert memory: bandwidth probes and profiles (B_P, B_H, B_D), "
                                       "the memory roofline, counters, the routing trace and its recorder."}),
    Room("server/api", "the HTTP API adapters in one room",
         _in("freetoken.server.api", "openai_api:openai openai_responses:responses anthropic_api:anthropic "
             "tokenize_api:tokenize sse logprobs_api:logprobs"),
         {"freetoken.server.api": "The HTTP API adapters (OpenAI, OpenAI Responses, Anthropic, tokenize) and "
                                  "their SSE framing, over the neutral generation layer."}),
    Room("server/guards", "the server's security guards in one room",
         _in("freetoken.server.guards", "request_guard request_limits conn_timeouts keys log_privacy private_file"),
         {"freetoken.server.guards": "What keeps the server safe: drive-by requests, body limits, slow clients, "
                                     "keys, log privacy, private files."}),
    Room("server/operations", "the operators' routes and process care in one room",
         _in("freetoken.server.operations", "admin metrics shutdown memory_trim"),
         {"freetoken.server.operations": "Running a server: the admin memory endpoint, metrics, graceful "
                                         "shutdown, giving the C heap back."}),
    Room("cli: launch", "client-side tools that serve nothing move beside the CLI verb that uses them",
         _in("freetoken.cli", "launch agent_window", "freetoken.server")),
    Room("layers/attention", "the attention variants in one room",
         _in("freetoken.layers.attention", "attention:paged paged_flex prefill_attention:prefill sinks mla dsa "
             "dsa_pooled gated_attention:gated v4_attention:v4 compressor"),
         {"freetoken.layers.attention": "Attention over the paged KV cache and its variants: prefill without a "
                                        "mask, flex on the device, sinks, MLA, DSA, gated, DeepSeek-V4's."}),
    Room("engine/prefix", "the prefix cache and its checkpoint policy in one room",
         _in("freetoken.engine.prefix", "prefix_cache:cache prefix_replay:replay checkpoint_policy anchors"),
         {"freetoken.engine.prefix": "Prefix reuse: the radix tree over the paged KV, where hybrid models "
                                     "checkpoint their state, agents' anchors, and a model-free replay."}),
    Room("weights/gguf", "the GGUF reader's files in a subpackage",
         _in("freetoken.weights.gguf", "gguf:reader gguf_config:config gguf_experts:experts gguf_hybrid:hybrid "
             "gguf_meta:meta gguf_names:names gguf_side:side gguf_spm:spm gguf_tokenizer:tokenizer "
             "gguf_types:types synthetic_gguf:synthetic gguf_deepseek4:deepseek4"),
         {"freetoken.weights.gguf": "GGUF files: the reader, metadata and names mapped to the Hugging Face "
                                    "layout, types, tokenizer, side files, a synthetic writer."}),
    Room("models/qwen", "the Qwen family's architectures in one room (models/ at most 15 modules)",
         _in("freetoken.models.qwen", "qwen2 qwen2_moe qwen3 qwen3_moe qwen3_next qwen3_5_moe"),
         {"freetoken.models.qwen": "The Qwen family: dense Qwen2/Qwen3, Qwen1.5/2-MoE, Qwen3-MoE, the hybrid "
                                   "Qwen3-Next and Qwen3.5/3.6-MoE."}),
    Room("models/deepseek", "the DeepSeek family's architectures in one room",
         _in("freetoken.models.deepseek", "deepseek_v3 deepseek_v32 deepseek_v4"),
         {"freetoken.models.deepseek": "The DeepSeek family: V3/R1/Kimi-K2 (MLA), V3.2 (sparse attention), V4."}),
    Room("models/glm", "the GLM family's architectures in one room",
         _in("freetoken.models.glm", "glm4_moe glm4_moe_lite glm5_next glm_moe_dsa"),
         {"freetoken.models.glm": "The GLM family: GLM-4.5/4.6/4.7 MoE, GLM-4.7-Lite, GLM-5 (DSA), GLM-5 Next."}),
    Room("weights/ftw", "the FTW format's files in a subpackage",
         _in("freetoken.weights.ftw", "ftw_format:format ftw_gguf:from_gguf ftw_load:load ftw_map:map "
             "ftw_reader:reader ftw_writer:writer"),
         {"freetoken.weights.ftw": "FTW, FreeToken's own weights file: format, writer, reader, loading, "
                                   "and the conversion from GGUF."}),
]

# One name per thing: (module as listed before the moves, old name, new name, why).
RENAMES = [
    ("freetoken.server.server_state", "Settings", "ServerSettings",
     "the server's options; config.Settings is the engine's resolved settings"),
    ("freetoken.kernels.choices", "resolve", "cpu_choices",
     "the CPU choices of one build; memory/resolve.resolve is the one resolve (options -> Settings)"),
]

# Folders split into rooms, and the modules that stay directly in each (anything else is printed).
STAY = {
    "freetoken/models": None,     # architectures: every module left is one (plus decoder, registry...)
    "freetoken/experts": {"__init__", "base", "formats", "ggml_banks", "grouped_pool"},
    "freetoken/server": {"__init__", "app", "build", "chat", "engine_loop", "errors", "events", "generation",
                         "grammar", "prepare", "prompt_tokens", "schema_check", "server_state", "web_ui"},
    "freetoken/layers": {"__init__", "linear", "ggml_linear", "kernel_rows", "concat", "mlp", "moe", "norm", "rope",
                         "hyper", "zeros", "deltanet", "kda", "state", "host_copy"},
    "freetoken/weights": {"__init__", "checkpoint", "modelopt", "pread", "source", "stores", "validate", "partial", "file_kind"},
}
MODELS_NOT_ARCHITECTURES = {"loader", "experts_backend", "disk_layout", "convert"}


# --- the tree ------------------------------------------------------------------------------------
def git(*args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=check, capture_output=True, text=True).stdout


def mod_path(mod: str) -> Path:
    return REPO / (mod.replace(".", "/") + ".py")


def modules() -> set[str]:
    out = set()
    for f in (REPO / PKG).rglob("*.py"):
        parts = list(f.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.add(".".join(parts))
    return out


def module_of(path: Path) -> tuple[str, bool]:
    """(dotted module of a file under freetoken/, whether it is a package's __init__)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def tracked(suffixes=TEXT_SUFFIXES) -> list[Path]:
    return [REPO / p for p in git("ls-files").splitlines()
            if Path(p).suffix in suffixes and (REPO / p).is_file() and (REPO / p).resolve() != SELF]


# --- rewriting -----------------------------------------------------------------------------------
class Mapper:
    """Old dotted module -> new, for the moves of one run (`pending`: moved in this run) and every
    move ever listed (stale references to non-colliding old names are rewritten too)."""

    def __init__(self, pending: dict[str, str], all_moves: dict[str, str]):
        self.pending, self.all = pending, all_moves
        self.mods = modules()

    def _colliding(self, old: str) -> bool:
        """The old module's name is now a package (or a module) of the tree."""
        return old in self.mods

    def map_module(self, name: str) -> str | None:
        """The new name of exactly this old module, or None."""
        if name in self.pending:
            return self.pending[name]
        if name in self.all and not self._colliding(name):
            return self.all[name]
        return None

    def map_dotted(self, token: str) -> str:
        """A dotted reference (module, module.attribute, ...): its longest old-module prefix mapped."""
        parts = token.split(".")
        for n in range(len(parts), 1, -1):
            head, rest = ".".join(parts[:n]), parts[n:]
            if head in self.pending or head in self.all:
                new = self.pending.get(head)
                if new is None and not self._colliding(head):
                    new = self.all[head]
                if new is None:
                    return token
                if rest and head in self.mods and ".".join([head, rest[0]]) in self.mods:
                    return token            # already the new package's module
                return ".".join([new, *rest])
        return token


def _package_of(mod: str, is_init: bool) -> list[str]:
    return mod.split(".") if is_init else mod.split(".")[:-1]


def _relative(target: str, pkg: list[str]) -> tuple[int, str]:
    t = target.split(".")
    common = 0
    while common < min(len(t), len(pkg)) and t[common] == pkg[common]:
        common += 1
    return len(pkg) - common + 1, ".".join(t[common:])


_FROM = re.compile(r"from\s+(\.*)([\w.]*)\s+import\s")


def rewrite_imports(text: str, old_mod: str, new_mod: str, is_init: bool, m: Mapper) -> str:
    """Every `from ... import ...` of a freetoken module in `text` (the file was `old_mod`, is now
    `new_mod`) pointed at the modules' new places; relative stays relative."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    old_pkg, new_pkg = _package_of(old_mod, is_init), _package_of(new_mod, is_init)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = old_pkg[:len(old_pkg) - (node.level - 1)]
            src = ".".join(base + (node.module.split(".") if node.module else []))
        elif node.module and node.module.split(".")[0] == PKG:
            src = node.module
        else:
            continue
        # each imported name: a submodule (maybe moved) or an attribute of `src` (maybe moved)
        groups: dict[str, list[str]] = {}
        for a in node.names:
            sub = f"{src}.{a.name}"
            new_sub = m.map_module(sub)
            if new_sub is not None:
                parent, last = new_sub.rsplit(".", 1)
                alias = a.asname or (a.name if last != a.name else None)
                groups.setdefault(parent, []).append(last + (f" as {alias}" if alias else ""))
            else:
                target = m.map_module(src) or src
                groups.setdefault(target, []).append(a.name + (f" as {a.asname}" if a.asname else ""))
        originals = [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
        same_names = len(groups) == 1 and next(iter(groups.values())) == originals
        if same_names and next(iter(groups)) == src and (not node.level or old_pkg == new_pkg):
            continue                        # nothing moved that this import names

        def spec(target: str) -> str:
            if not node.level:
                return target
            level, rest = _relative(target, new_pkg)
            return "." * level + rest

        if same_names:
            edits.append((node, "module", spec(next(iter(groups)))))
        else:
            edits.append((node, "split", [f"from {spec(t)} import {', '.join(ns)}" for t, ns in groups.items()]))
    for node, kind, new in sorted(edits, key=lambda e: -e[0].lineno):
        first, last = node.lineno - 1, node.end_lineno - 1
        if kind == "module":
            line = lines[first]
            mm = _FROM.match(line, node.col_offset)
            if mm is None:
                continue
            lines[first] = line[:mm.start()] + f"from {new} import " + line[mm.end():]
        else:
            indent = lines[first][:node.col_offset]
            comment = ""
            tail = lines[last].rstrip("\n")
            if "#" in tail[node.end_col_offset:]:
                comment = "  " + tail[node.end_col_offset:].strip()
            stmts = [indent + s for s in new]
            stmts[0] += comment
            lines[first:last + 1] = [s + "\n" for s in stmts]
    return "".join(lines)


_DOTTED = re.compile(rf"(?<![\w.]){PKG}(?:\.\w+)+")


def _path_patterns(m: Mapper) -> list[tuple[re.Pattern, str]]:
    out = []
    for old, new in {**m.all, **m.pending}.items():
        if old not in m.pending and m._colliding(old):
            continue
        o = old.split(".", 1)[1].replace(".", "/")
        n = new.split(".", 1)[1].replace(".", "/")
        # freetoken/experts/pool.py, experts/pool.py, models/experts_backend.cache_choice
        out.append((re.compile(rf"(?<![\w./-])({PKG}/)?{re.escape(o)}(?=\.py\b|[.:][A-Za-z_]|`)"), rf"\g<1>{n}"))
        # a bare file name (`ftw_load.py`) whose name changes, when no other module has that name
        old_base, new_base = o.rsplit("/", 1)[-1], n.rsplit("/", 1)[-1]
        if old_base != new_base and sum(1 for f in (REPO / PKG).rglob(old_base + ".py")) <= 1 \
                and sum(1 for x in {**m.all, **m.pending} if x.rsplit(".", 1)[-1] == old_base) == 1:
            out.append((re.compile(rf"(?<![\w./-]){re.escape(old_base)}\.py\b"), f"{n}.py"))
    return out


def rewrite_text(text: str, m: Mapper, patterns) -> str:
    text = _DOTTED.sub(lambda mm: m.map_dotted(mm.group(0)), text)
    for pat, repl in patterns:
        text = pat.sub(repl, text)
    return text


# --- one room ------------------------------------------------------------------------------------
def pending_moves(room: Room) -> dict[str, str]:
    out = {}
    for old, new in room.moves:
        if mod_path(old).is_file() and not mod_path(new).is_file():
            out[old] = new
        elif mod_path(old).is_file() and mod_path(new).is_file():
            sys.exit(f"restructure: both {mod_path(old)} and {mod_path(new)} exist; resolve by hand")
    return out


def all_moves() -> dict[str, str]:
    return {o: n for r in ROOMS for o, n in r.moves}


def apply_room(room: Room, dry: bool) -> bool:
    pending = pending_moves(room)
    if not pending:
        return False
    print(f"room {room.name}: " + ", ".join(f"{o} -> {n}" for o, n in pending.items()))
    if dry:
        return True
    for pkg, doc in room.packages.items():
        init = mod_path(pkg).with_suffix("") / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text(f'"""{doc}"""\n')
            git("add", str(init))
    inverse = {}
    for old, new in pending.items():
        mod_path(new).parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(mod_path(old)), str(mod_path(new)))
        inverse[str(mod_path(new))] = old
    rewrite_all(Mapper(pending, all_moves()), inverse)
    git("add", "-u")
    git("commit", "-q", "-m", f"restructure: {room.name}: {room.why} (tools/restructure.py: "
        + ", ".join(f"{o.removeprefix(PKG + '.')} -> {n.removeprefix(PKG + '.')}" for o, n in pending.items()) + ")")
    return True


def rewrite_all(m: Mapper, inverse: dict[str, str]) -> int:
    patterns = _path_patterns(m)
    changed = 0
    for f in tracked():
        text = f.read_text(errors="surrogateescape")
        new = text
        if f.suffix == ".py":
            if f.is_relative_to(REPO / PKG):
                new_mod, is_init = module_of(f)
                old_mod = inverse.get(str(f), new_mod)
            else:
                old_mod = new_mod = "tests.x"
                is_init = False
            new = rewrite_imports(new, old_mod, new_mod, is_init, m)
        new = rewrite_text(new, m, patterns)
        if new != text:
            f.write_text(new, errors="surrogateescape")
            changed += 1
    return changed


# --- renames --------------------------------------------------------------------------------------
def _rename_in(text: str, module: str, old: str, new: str, defines: bool, pkg: list[str]) -> str:
    """`old` -> `new` where it means `module`'s `old`: in the defining module every use of the
    name; elsewhere names imported from the module (unaliased: their uses too) and attribute
    reads on a name bound to the module; dotted strings `module.old` everywhere."""
    text = re.sub(rf"(?<![\w.]){re.escape(module)}\.{old}\b", f"{module}.{new}", text)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    parent, _, leaf = module.rpartition(".")
    bound, uses_name = set(), defines
    spots = []                                   # (line, col, length) of `old` to replace
    lines = text.splitlines(keepends=True)
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and (n.module or n.level):
            src = ".".join(pkg[:len(pkg) - (n.level - 1)] + (n.module.split(".") if n.module else [])) \
                if n.level else n.module
            if src == module:
                for a in n.names:
                    if a.name == old:
                        uses_name = uses_name or a.asname is None
                        m = re.search(rf"\b{old}\b", lines[n.lineno - 1])
                        if m and n.lineno == n.end_lineno:
                            spots.append((n.lineno, m.start(), len(old)))
            elif src == parent:
                bound |= {a.asname or a.name for a in n.names if a.name == leaf}
        elif isinstance(n, ast.Import):
            bound |= {a.asname for a in n.names if a.name == module and a.asname}
    for n in ast.walk(tree):
        if uses_name and isinstance(n, ast.Name) and n.id == old:
            spots.append((n.lineno, n.col_offset, len(old)))
        elif defines and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == old:
            m = re.search(rf"\b(def|class)\s+{old}\b", lines[n.lineno - 1])
            if m:
                spots.append((n.lineno, m.end() - len(old), len(old)))
        elif isinstance(n, ast.Attribute) and n.attr == old and isinstance(n.value, ast.Name) and n.value.id in bound:
            spots.append((n.end_lineno, n.end_col_offset - len(old), len(old)))
    for line, col, size in sorted(set(spots), reverse=True):
        t = lines[line - 1]
        if t[col:col + size] == old:
            lines[line - 1] = t[:col] + new + t[col + size:]
    return "".join(lines)


def apply_renames(dry: bool) -> list[str]:
    done = []
    moves = all_moves()
    for module, old, new, why in RENAMES:
        module = moves.get(module, module)
        path = mod_path(module)
        if not path.exists():
            print(f"rename {module}.{old}: {path} not found; skipped")
            continue
        if not re.search(rf"^(def|class)\s+{old}\b", path.read_text(), re.M):
            continue                             # done already
        done.append(f"{module}.{old} -> {new}")
        if dry:
            continue
        for f in tracked():
            text = f.read_text(errors="surrogateescape")
            if old not in text:
                continue
            pkg = _package_of(*module_of(f)) if f.is_relative_to(REPO / PKG) else []
            new_text = _rename_in(text, module, old, new, f == path, pkg) if f.suffix == ".py" else \
                re.sub(rf"(?<![\w.]){re.escape(module)}\.{old}\b", f"{module}.{new}", text)
            if new_text != text:
                f.write_text(new_text, errors="surrogateescape")
        git("add", "-u")
        git("commit", "-q", "-m", f"restructure: one name per thing: {module.removeprefix(PKG + '.')}.{old} -> {new} "
            f"({why}; tools/restructure.py)")
    return done


# --- the map in docs/architecture.md --------------------------------------------------------------
MAP_BEGIN, MAP_END = "<!-- rooms: generated by tools/restructure.py --map -->", "<!-- rooms: end -->"


def _first_line(init: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    except (OSError, SyntaxError):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def rooms_map() -> str:
    """Every package of freetoken/ with its docstring's first paragraph and its modules."""
    rows = []
    for init in sorted((REPO / PKG).rglob("__init__.py")):
        d = init.parent
        mods = sorted(p.stem for p in d.glob("*.py") if p.name != "__init__.py")
        subs = sorted(p.name + "/" for p in d.iterdir() if (p / "__init__.py").exists())
        depth = len(d.relative_to(REPO / PKG).parts)
        if depth == 0:
            continue
        rel = d.relative_to(REPO / PKG).as_posix()
        line = f"{'  ' * (depth - 1)}- `{rel}/` ({len(mods)} modules)"
        about = _first_line(init)
        rows.append(line + (f": {about}" if about else ""))
        if mods:
            rows.append(f"{'  ' * depth}  modules: {', '.join(mods)}" + (f"; rooms: {', '.join(subs)}" if subs else ""))
    return "\n".join(rows)


def write_map() -> bool:
    """Replace the generated map between the markers in docs/architecture.md; True if it changed."""
    doc = REPO / "docs" / "architecture.md"
    text = doc.read_text()
    if MAP_BEGIN not in text or MAP_END not in text:
        return False
    head, rest = text.split(MAP_BEGIN, 1)
    tail = rest.split(MAP_END, 1)[1]
    new = f"{head}{MAP_BEGIN}\n{rooms_map()}\n{MAP_END}{tail}"
    if new != text:
        doc.write_text(new)
        return True
    return False


# --- reports -------------------------------------------------------------------------------------
def unmapped() -> list[str]:
    out = []
    moving = {mod_path(o) for o in all_moves()}
    for folder, stay in STAY.items():
        for f in sorted((REPO / folder).glob("*.py")):
            if f in moving:
                continue                    # a move still to do (--dry-run)
            if stay is None:
                if f.stem in MODELS_NOT_ARCHITECTURES:
                    out.append(f"{f.relative_to(REPO)}: not an architecture; add a move to ROOMS")
            elif f.stem not in stay:
                out.append(f"{f.relative_to(REPO)}: not in a room; add it to one in ROOMS (or to STAY)")
    return out


def wide_folders() -> list[str]:
    out = []
    for d in sorted({p.parent for p in (REPO / PKG).rglob("*.py")}):
        n = len([p for p in d.glob("*.py") if p.name != "__init__.py"])
        if n > MAX_MODULES:
            out.append(f"{d.relative_to(REPO)}: {n} modules (target <= {MAX_MODULES})")
    return out


def check() -> int:
    """Import every module of the package and run the layering test."""
    code = ("import importlib, pkgutil, freetoken\n"
            "bad = []\n"
            "for m in pkgutil.walk_packages(freetoken.__path__, 'freetoken.'):\n"
            "    if m.name.endswith('__main__'):\n        continue\n"
            "    try:\n        importlib.import_module(m.name)\n"
            "    except ModuleNotFoundError as e:\n"
            "        if (e.name or '').startswith('freetoken'):\n            bad.append(f'{m.name}: {e}')\n"
            "        else:\n            print(f'{m.name}: optional dependency missing: {e.name}')\n"
            "    except BaseException as e:\n        bad.append(f'{m.name}: {type(e).__name__}: {e}')\n"
            "print('\\n'.join(bad) or 'every module imports')\n"
            "raise SystemExit(1 if bad else 0)\n")
    rc = subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode
    rc |= subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_layering.py"], cwd=REPO).returncode
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the moves still to do; change nothing")
    ap.add_argument("--check", action="store_true", help="then import every module and run tests/test_layering.py")
    ap.add_argument("--map", action="store_true", help="only rewrite the package map in docs/architecture.md")
    args = ap.parse_args(argv)
    if args.map:
        print("docs/architecture.md map", "rewritten" if write_map() else "unchanged")
        return 0
    if not args.dry_run and git("status", "--porcelain", "--untracked-files=no").strip():
        sys.exit("restructure: the work tree has uncommitted changes; commit or stash them first")
    did = [r.name for r in ROOMS if apply_room(r, args.dry_run)]
    did += apply_renames(args.dry_run)
    if not args.dry_run:
        # references to old names a later merge brought in (non-colliding names only)
        if rewrite_all(Mapper({}, all_moves()), {}):
            git("add", "-u")
            git("commit", "-q", "-m", "restructure: stale references to moved modules rewritten (tools/restructure.py)")
            did.append("stale references")
        if write_map():
            git("add", "docs/architecture.md")
            git("commit", "-q", "-m", "docs/architecture.md: the package map regenerated (tools/restructure.py --map)")
            did.append("docs map")
    print("rooms applied:" if not args.dry_run else "rooms to apply:", ", ".join(did) or "none (already done)")
    for line in unmapped():
        print("unmapped:", line)
    for line in wide_folders():
        print("wide:", line)
    return check() if args.check and not args.dry_run else 0


if __name__ == "__main__":
    raise SystemExit(main())
