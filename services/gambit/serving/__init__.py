"""gRPC pieces without Ray: generated protos, the Scorer server and client, auth, metrics, run store."""
