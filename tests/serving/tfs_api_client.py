"""Calls a gRPC server through TF Serving's official ``tensorflow_serving.apis`` stubs, in a process of its own.

``python -m tests.serving.tfs_api_client PORT`` reads a JSON list of calls from stdin, each
``{"method": NAME, "request": {...}}`` (the request message in protobuf's JSON mapping), and prints
a JSON list of answers: ``{"code": "OK", "response": {...}}`` or ``{"code": STATUS, "details": TEXT}``.
It runs apart from the tests because TF Serving's messages and the ones ``seqapps.serving.apis``
generates have the same full names, which one protobuf registry refuses to hold twice.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import (classification_pb2, inference_pb2, model_management_pb2, model_service_pb2_grpc,
                                     prediction_service_pb2_grpc, regression_pb2)

#: method -> (its request message, the stub class that has it)
METHODS = {
    "Classify": (classification_pb2.ClassificationRequest, prediction_service_pb2_grpc.PredictionServiceStub),
    "Regress": (regression_pb2.RegressionRequest, prediction_service_pb2_grpc.PredictionServiceStub),
    "MultiInference": (inference_pb2.MultiInferenceRequest, prediction_service_pb2_grpc.PredictionServiceStub),
    "HandleReloadConfigRequest": (model_management_pb2.ReloadConfigRequest, model_service_pb2_grpc.ModelServiceStub),
}


def call(channel: grpc.Channel, method: str, request: dict[str, Any]) -> dict[str, Any]:
    """Sends one request; returns its answer or its gRPC error as JSON-able values."""
    message_class, stub_class = METHODS[method]
    try:
        response = getattr(stub_class(channel), method)(json_format.ParseDict(request, message_class()), timeout=30)
    except grpc.RpcError as error:
        return {"code": error.code().name, "details": error.details()}
    return {"code": "OK", "response": json_format.MessageToDict(response)}


def main() -> None:
    """Runs the calls on stdin against ``127.0.0.1:PORT`` and prints the answers."""
    calls = json.load(sys.stdin)
    with grpc.insecure_channel(f"127.0.0.1:{int(sys.argv[1])}") as channel:
        print(json.dumps([call(channel, entry["method"], entry["request"]) for entry in calls]))


if __name__ == "__main__":
    main()
