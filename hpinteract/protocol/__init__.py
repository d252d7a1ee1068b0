"""Wire-level vocabulary shared by every process: messages, signing, connection files,
run directories, hyper-parameter specs and typed errors.

Runs in: every process (job ranks, supervisor, clients). Imports neither zmq nor torch.
"""
