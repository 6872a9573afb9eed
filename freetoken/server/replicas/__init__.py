"""FreeToken replicas on Ray Serve (`freetoken serve --replicas N`), routed by prefix.

`table.py` (which replica holds which prompt prefix, and the routing rule) has no Ray in
it; everything else imports ray and is reached only from `freetoken serve --replicas`.
See docs/distributed.md."""
