"""TF Serving's REST API over ``saved_models/<name>/<version>/``, on FastAPI and uvicorn.

A client written for TF Serving works unchanged:

    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]             version status
    GET  /v1/models/{name}[/versions/{v}|/labels/{l}]/metadata    signature defs
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:predict     row (``instances``) or columnar (``inputs``)
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:classify    tf.Example JSON (``examples``, ``context``)
    POST /v1/models/{name}[/versions/{v}|/labels/{l}]:regress     tf.Example JSON
    GET  /monitoring/prometheus/metrics                           request counts and latencies per model

and, with ``--grpc-port``, TF Serving's gRPC ``PredictionService`` (Predict, GetModelMetadata)
and ``ModelService.GetModelStatus`` (see ``grpc_service``).

Models are called through ``tf.saved_model.load``, as TF Serving does, in a
thread pool off the event loop. The latest integer-named version of each model
is served; a poll thread picks up new versions and drops the old one only after
the new one has loaded. Requests that arrive together can be merged along the
batch dimension (``max_batch_size``, ``batch_timeout_ms``), as TF Serving's
batching does. Bad requests are answered ``{"error": "..."}`` with 400 or 404; every
request is bounded (nesting depth, rows, string bytes, generated length, body bytes, time).

Modules: ``repository`` (model folders, versions, labels, polling, loading), ``protocol`` (request
checks and TF Serving's JSON), ``batching``, ``runner`` (``ServingOptions`` and the ``ModelRunner``
that REST and gRPC share), ``metrics``, ``apis`` (TF Serving's messages, generated from ``protos/``),
``grpc_service``, and ``app`` (the FastAPI application, the uvicorn server, ``seqapps serve``).
The package imports none of them, so the gRPC path and the export's warm-up records do not load
FastAPI: import the module you use (``from seqapps.serving.app import serve``).
"""
