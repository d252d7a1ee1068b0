"""The training side: runs inside every torchrun rank (and the supervisor that starts them).

Runs in: the job's processes only. This is the one package that imports torch.
"""
