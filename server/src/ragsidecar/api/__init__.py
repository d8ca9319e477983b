"""The gRPC layer: servicers that translate proto <-> domain, interceptors, status mapping, the server."""
