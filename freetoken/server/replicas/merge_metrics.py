"""One Prometheus page from the replicas' pages: every sample gets a `replica` label."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def merge_pages(pages: dict[str, str]) -> str:
    """pages: replica id -> its /metrics text. Families keep one HELP/TYPE header."""
    families: dict[str, tuple[str, str, list[str]]] = {}
    for replica, text in sorted(pages.items()):
        for fam in text_string_to_metric_families(text):
            _, _, lines = families.setdefault(fam.name, (fam.type, fam.documentation, []))
            for s in fam.samples:
                labels = {**s.labels, "replica": replica}
                body = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
                lines.append(f"{s.name}{{{body}}} {s.value!r}")
    out = []
    for name, (typ, doc, lines) in families.items():
        out.append(f"# HELP {name} {_esc(doc)}")
        out.append(f"# TYPE {name} {typ}")
        out.extend(lines)
    return "\n".join(out) + "\n"
