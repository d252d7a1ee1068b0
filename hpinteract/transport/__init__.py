"""ZeroMQ sockets speaking the signed protocol: control (DEALER→ROUTER) and metrics
(PUB/SUB with snapshot catch-up).

Runs in: rank 0's coordinator (server side) and client processes. No torch.
"""
