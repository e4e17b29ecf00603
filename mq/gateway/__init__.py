"""mq.gateway: the broker's gRPC endpoint for RocketMQ 5.x clients (RocketMQ 5's proxy, "local"
mode: one per broker, on grpcServerPort).

    service   MessagingService: the RPCs, answered through the broker's own 4.x path
    convert   5.x messages to 4.x properties, the send checks, answer codes to Status codes
    role      the role process: a grpc.aio server, stopped through the launcher's stop pipe
    options   GatewayOptions, what it needs of the broker's configuration (no grpc import)
    pop       POP consumption: checkpoints and acks in the revive topic, the revive loop, orderly groups
    timer     timer (DELAY) messages: rmq_sys_wheel_timer, delivered at their second, recalls
    auth      ACL: the authorization header against plain_acl.yml, then permissions
    stats     the counters /metrics shows

Imports point one way: gateway -> client (routes), remoting, wire.  The broker's supervisor
imports role and options to start the role; grpc and protobuf load only in the role process."""
