"""The replicas' /health counts alive and configured replicas (no Ray needed): one replica
of two down reads 1 of 2 and "degraded", never "replicas_total: 1" (issue 36)."""
from freetoken.server.replicas.health import health_body


def test_one_of_two_down_is_degraded_and_says_two():
    body, status = health_body({"a": {"status": "ok"}}, configured=2)
    assert status == 200 and body["status"] == "degraded"
    assert (body["replicas_ok"], body["replicas_alive"], body["replicas_configured"], body["replicas_total"]) == (1, 1, 2, 2)


def test_alive_but_not_ok_counts_as_alive():
    body, status = health_body({"a": {"status": "ok"}, "b": {"status": "unreachable"}}, configured=2)
    assert status == 200 and body["status"] == "degraded" and body["replicas_alive"] == 2 and body["replicas_ok"] == 1


def test_all_up_is_ok_and_none_up_is_503():
    assert health_body({"a": {"status": "ok"}, "b": {"status": "ok"}}, 2)[0]["status"] == "ok"
    body, status = health_body({}, 2)
    assert status == 503 and body["status"] == "degraded" and body["replicas_total"] == 2
