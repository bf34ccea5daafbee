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

Modules: ``repository`` (model folders, versions, labels, polling, loading), ``protocol`` (REST
request parsing and response formatting, TF Serving's JSON), ``batching``, ``metrics``,
``grpc_service`` and ``app`` (FastAPI application, uvicorn server, ``seqapps serve``).
"""
from seqapps.serving.app import ModelRunner, ServingOptions, bind, create_app, make_server, serve, serve_in_thread
from seqapps.serving.batching import Batcher
from seqapps.serving.protocol import (PredictRequest, RequestBounds, format_predict_response,
                                      parse_predict_request)
from seqapps.serving.repository import (LoadedVersion, ModelRepository, RequestError, Signature, TensorInfo,
                                        load_version)

__all__ = ["Batcher", "LoadedVersion", "ModelRepository", "ModelRunner", "PredictRequest", "RequestBounds",
           "RequestError", "ServingOptions", "Signature", "TensorInfo", "bind", "create_app",
           "format_predict_response", "load_version", "make_server", "parse_predict_request", "serve",
           "serve_in_thread"]
