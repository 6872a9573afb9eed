"""The front end's `/health` body from each live replica's (no Ray in here): how many
replicas answer ok, how many are alive (Ray lists them), and how many were configured
(`--replicas N`), so one replica of two being down reads "1 of 2", not "1 of 1"."""
from __future__ import annotations


def health_body(per_replica: dict[str, dict], configured: int) -> tuple[dict, int]:
    """(body, HTTP status): 200 while at least one replica is ok; "ok" only when every
    configured replica is, else "degraded"."""
    ok = sum(1 for v in per_replica.values() if v.get("status") == "ok")
    status = "ok" if ok >= configured and ok else "degraded"
    body = {"status": status, "replicas_ok": ok, "replicas_alive": len(per_replica),
            "replicas_configured": configured, "replicas_total": configured,
            "replicas": per_replica}
    return body, 200 if ok else 503
