"""The notebook surface: ``job.dashboard()``, ``job.plot()``, ``hpi.compare``, ``%hp``.

Runs in: the notebook kernel. Imports the client only (never torch), and Bokeh and
ipywidgets only here: the rest of the package loads without them.
"""
