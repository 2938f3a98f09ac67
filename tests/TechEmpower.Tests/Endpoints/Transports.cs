using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

// One test class per transport and mode: xunit runs each class as its own collection, in parallel
// with the others, and each shares one running sample (its class fixture) across its tests.
// test.sh's .NET 11 run picks classes by these names: Linux_<mode> (the transport's defaults), Linux_io_uring_<mode>, Sockets_<mode>.

public sealed class Linux_middleware(LinuxMiddlewareFixture sample) : MiddlewareEndpoints<LinuxMiddlewareFixture>(sample);

public sealed class Linux_platform(LinuxPlatformFixture sample) : PlatformEndpoints<LinuxPlatformFixture>(sample);

public sealed class Linux_aio_platform(LinuxAioPlatformFixture sample) : PlatformEndpoints<LinuxAioPlatformFixture>(sample);

public sealed class Linux_io_uring_middleware(LinuxIoUringMiddlewareFixture sample) : MiddlewareEndpoints<LinuxIoUringMiddlewareFixture>(sample);

public sealed class Linux_io_uring_platform(LinuxIoUringPlatformFixture sample) : PlatformEndpoints<LinuxIoUringPlatformFixture>(sample);

public sealed class Linux_threadpool_middleware(LinuxThreadPoolMiddlewareFixture sample) : MiddlewareEndpoints<LinuxThreadPoolMiddlewareFixture>(sample);

public sealed class Linux_threadpool_platform(LinuxThreadPoolPlatformFixture sample) : PlatformEndpoints<LinuxThreadPoolPlatformFixture>(sample);

public sealed class Sockets_middleware(SocketsMiddlewareFixture sample) : MiddlewareEndpoints<SocketsMiddlewareFixture>(sample);

public sealed class Sockets_platform(SocketsPlatformFixture sample) : PlatformEndpoints<SocketsPlatformFixture>(sample);

public sealed class Sockets_inline_middleware(SocketsInlineMiddlewareFixture sample)
    : MiddlewareEndpoints<SocketsInlineMiddlewareFixture>(sample);

public sealed class Sockets_inline_platform(SocketsInlinePlatformFixture sample)
    : PlatformEndpoints<SocketsInlinePlatformFixture>(sample);

public sealed class Libuv_middleware(LibuvMiddlewareFixture sample) : MiddlewareEndpoints<LibuvMiddlewareFixture>(sample);

public sealed class Libuv_platform(LibuvPlatformFixture sample) : PlatformEndpoints<LibuvPlatformFixture>(sample);

// HTTP/2 only (--protocols http2): h2c with prior knowledge and gRPC, on the Linux transport's schedulings and engines
// and on Sockets.

public sealed class Linux_h2c(LinuxH2cFixture sample) : Http2Endpoints<LinuxH2cFixture>(sample);

public sealed class Linux_threadpool_h2c(LinuxThreadPoolH2cFixture sample) : Http2Endpoints<LinuxThreadPoolH2cFixture>(sample);

public sealed class Linux_io_uring_h2c(LinuxIoUringH2cFixture sample) : Http2Endpoints<LinuxIoUringH2cFixture>(sample);

public sealed class Linux_io_uring_threadpool_h2c(LinuxIoUringThreadPoolH2cFixture sample)
    : Http2Endpoints<LinuxIoUringThreadPoolH2cFixture>(sample);

public sealed class Sockets_h2c(SocketsH2cFixture sample) : Http2Endpoints<SocketsH2cFixture>(sample);
