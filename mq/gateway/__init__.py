"""mq.gateway: the broker's gRPC endpoint for RocketMQ 5.x clients (RocketMQ 5's proxy, "local"
mode: one per broker, on grpcServerPort).

    service   MessagingService: the RPCs, answered through the broker's own 4.x path
    convert   5.x messages to 4.x properties, the send checks, answer codes to Status codes
    role      the role process: a grpc.aio server, stopped through the launcher's stop pipe
    options   GatewayOptions, what it needs of the broker's configuration (no grpc import)

Imports point one way: gateway -> client (routes), remoting, wire.  The broker's supervisor
imports role and options to start the role; grpc and protobuf load only in the role process."""
