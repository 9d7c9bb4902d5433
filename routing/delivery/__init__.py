"""Delivery: after each assignment, signed outbound webhooks and an e-mail to the rep.

``models`` holds the outbox (one ``Delivery`` row per recipient, retried until delivered or a
day old) and its append-only attempt log; ``services`` schedules, sends and sweeps; ``egress``
refuses URLs that point into the private network; ``signing`` is the Standard Webhooks scheme.
"""
