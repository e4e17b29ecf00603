"""The gateway's role process: a grpc.aio server for MessagingService on
listenAddress:grpcServerPort, until the launcher's stop pipe says stop (or the broker dies:
the pipe reads EOF).

The role runs asyncio's own event loop, not uvloop: grpc.aio drives its completion queue from
the running loop and supports the stdlib loop.  grpc is imported here, in the forked child,
never in the launcher (which must stay single-threaded: grpc starts threads at import)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

log = logging.getLogger("mq.gateway")

BIND_RETRY_S = 1.0
GRACE_S = 2.0


def _decoder(cls):
    """cls.FromString, with a request protobuf cannot parse read as None (the handler answers
    BAD_REQUEST in the body; grpc would answer a raising deserializer with gRPC INTERNAL)."""
    from google.protobuf.message import DecodeError

    def decode(data: bytes):
        try:
            return cls.FromString(data)
        except DecodeError:
            return None
    return decode


def _guarded(name: str, fn, resp_cls, stats):
    """A unary handler that answers a malformed request BAD_REQUEST and a bug (an exception)
    INTERNAL_SERVER_ERROR, both in the response's status, never as a gRPC error; each call is
    counted by the code it answered (mq.gateway.stats)."""
    from mq.wire.grpc5 import Code
    from .service import status

    async def handle(request, context):
        t0 = time.perf_counter_ns()
        if request is None:
            resp = resp_cls(status=status(Code.BAD_REQUEST, f"{name}: the request is not a {name} request"))
        else:
            try:
                resp = await fn(request, context)
            except Exception:
                log.exception("gRPC %s failed", name)
                resp = resp_cls(status=status(Code.INTERNAL_SERVER_ERROR, f"{name} failed in the broker (logged)"))
        stats.call(name, resp.status.code, time.perf_counter_ns() - t0)
        return resp
    return handle


def _counted_stream(name: str, fn, stats):
    """A server-streaming handler counted by the code of its first status frame, at its end."""
    async def handle(request, context):
        t0 = time.perf_counter_ns()
        code = 0
        async for frame in fn(request, context):
            if not code and frame.HasField("status"):
                code = frame.status.code
            yield frame
        stats.call(name, code, time.perf_counter_ns() - t0)
    return handle


def _handlers(service):
    import grpc
    from mq.wire.grpc5 import METHODS, SERVICE, msg
    from .service import METHODS_SERVED
    make = {"unary": grpc.unary_unary_rpc_method_handler, "server_stream": grpc.unary_stream_rpc_method_handler,
            "stream_stream": grpc.stream_stream_rpc_method_handler}
    table = {}
    for name in METHODS_SERVED:
        req, resp, shape = METHODS[name]
        fn = getattr(service, name)
        if shape == "unary":
            fn = _guarded(name, fn, msg(resp), service.stats)
        elif shape == "server_stream":
            fn = _counted_stream(name, fn, service.stats)
        table[name] = make[shape](fn, request_deserializer=_decoder(msg(req)),
                                  response_serializer=msg(resp).SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, table)


async def serve(opts, stop_fd: int | None) -> None:
    """Serves (opts: a GatewayOptions) until stop_fd is readable (a byte or EOF); without one,
    until cancelled."""
    import grpc
    from .service import MessagingService
    service = MessagingService(opts)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 130 * 1024 * 1024),
                                      ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((_handlers(service),))
    addr = f"{opts.listen_address}:{opts.grpc_port}"
    while True:
        try:
            if server.add_insecure_port(addr):
                break
        except RuntimeError as e:                  # grpc raises when the port is taken
            log.warning("gRPC endpoint: cannot listen on %s (%s); retrying", addr, e)
        await asyncio.sleep(BIND_RETRY_S)
    await server.start()
    await service.start()
    log.info("gRPC endpoint for RocketMQ 5.x clients on %s", addr)
    stopped = asyncio.Event()
    if stop_fd is not None:
        asyncio.get_running_loop().add_reader(stop_fd, stopped.set)
    try:
        await stopped.wait()
    finally:
        await server.stop(GRACE_S)
        await service.close()


def gateway_role_main(opts, stop) -> None:
    """Entry point of the gateway role (forked by the broker's launcher); opts: a GatewayOptions."""
    from mq.logs import ensure_logging, flush_logs
    # stopped through `stop` only, never half-way by a SIGTERM sent to the whole process group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ensure_logging("grpc")
    from mq import loop as mq_loop
    mq_loop.run(serve(opts, stop.fileno()))
    flush_logs()
    os._exit(0)
