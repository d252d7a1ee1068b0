"""The client side: ``Job``, ``launch``, ``attach``, ``jobs``; used by every surface.

Runs in: any Python process (notebook kernel, CLI, server extension). Never imports torch,
so a notebook attaches in milliseconds.
"""

from .answers import Ack, JobError
from .catalog import JobSummary, attach, jobs
from .job import Job
from .launch import launch

__all__ = ["Ack", "Job", "JobError", "JobSummary", "attach", "jobs", "launch"]
