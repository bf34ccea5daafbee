"""The built-in task pipelines, one module each.

They register like any third-party pipeline, through the ``seqapps.pipelines``
entry points in ``setup.cfg``; nothing here is imported until a pipeline is used.
"""
