using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

// One test class per transport and mode: xunit runs each class as its own collection, in parallel
// with the others, and each shares one running sample (its class fixture) across its tests.

public sealed class Linux_middleware(LinuxMiddlewareFixture sample) : MiddlewareEndpoints<LinuxMiddlewareFixture>(sample);

public sealed class Linux_platform(LinuxPlatformFixture sample) : PlatformEndpoints<LinuxPlatformFixture>(sample);

public sealed class Linux_aio_platform(LinuxAioPlatformFixture sample) : PlatformEndpoints<LinuxAioPlatformFixture>(sample);

public sealed class Linux_io_uring_middleware(LinuxIoUringMiddlewareFixture sample) : MiddlewareEndpoints<LinuxIoUringMiddlewareFixture>(sample);

public sealed class Linux_io_uring_platform(LinuxIoUringPlatformFixture sample) : PlatformEndpoints<LinuxIoUringPlatformFixture>(sample);

public sealed class Linux_adaptive_middleware(LinuxAdaptiveMiddlewareFixture sample) : MiddlewareEndpoints<LinuxAdaptiveMiddlewareFixture>(sample);

public sealed class Linux_adaptive_platform(LinuxAdaptivePlatformFixture sample) : PlatformEndpoints<LinuxAdaptivePlatformFixture>(sample);

public sealed class Sockets_middleware(SocketsMiddlewareFixture sample) : MiddlewareEndpoints<SocketsMiddlewareFixture>(sample);

public sealed class Sockets_platform(SocketsPlatformFixture sample) : PlatformEndpoints<SocketsPlatformFixture>(sample);

public sealed class Sockets_inline_middleware(SocketsInlineMiddlewareFixture sample)
    : MiddlewareEndpoints<SocketsInlineMiddlewareFixture>(sample);

public sealed class Sockets_inline_platform(SocketsInlinePlatformFixture sample)
    : PlatformEndpoints<SocketsInlinePlatformFixture>(sample);

public sealed class Libuv_middleware(LibuvMiddlewareFixture sample) : MiddlewareEndpoints<LibuvMiddlewareFixture>(sample);

public sealed class Libuv_platform(LibuvPlatformFixture sample) : PlatformEndpoints<LibuvPlatformFixture>(sample);
