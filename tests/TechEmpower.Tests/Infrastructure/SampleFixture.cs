using System.Diagnostics;
using System.Net;
using System.Runtime.InteropServices;
using System.Text.RegularExpressions;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>
/// One running sample per transport and mode, shared by a test class: started once, listening on a
/// kernel-picked loopback port and on a Unix socket, and killed (with its process tree) at the end.
/// Its first request is the readiness check, and its Date header is kept for the 3-second Date test.
/// With <c>--protocols http2</c> it serves HTTP/2 with prior knowledge (h2c) only, and so does its client.
/// </summary>
public abstract class SampleFixture : IAsyncLifetime, IAsyncDisposable
{
    private SampleProcess? _sample;
    private HttpClient? _client;

    /// <summary>Configures the sample to start.</summary>
    /// <param name="transport">The <c>--transport</c> value.</param>
    /// <param name="mode">The <c>--mode</c> value.</param>
    /// <param name="protocols">The <c>--protocols</c> value, or null to leave Kestrel's default.</param>
    protected SampleFixture(string transport, string mode, string? protocols = null)
    {
        Transport = transport;
        Mode = mode;
        Protocols = protocols;
        // Named after the fixture, not the transport and mode: several fixtures run the same transport and mode with
        // other options (--io aio, --io io_uring), in parallel, and must not share a socket path.
        UnixSocketPath = Path.Combine(Path.GetTempPath(), $"te-tests-{Environment.ProcessId}-{GetType().Name}.sock");
    }

    /// <summary>The <c>--transport</c> value.</summary>
    public string Transport { get; }

    /// <summary>The <c>--mode</c> value.</summary>
    public string Mode { get; }

    /// <summary>The <c>--protocols</c> value, or null.</summary>
    public string? Protocols { get; }

    /// <summary>The HTTP version <see cref="Client"/> speaks, and nothing else: 2.0 with <c>--protocols http2</c>.</summary>
    public Version ClientVersion => Protocols == "http2" ? HttpVersion.Version20 : HttpVersion.Version11;

    /// <summary>The Unix socket the sample listens on besides TCP.</summary>
    public string UnixSocketPath { get; }

    /// <summary>The running sample.</summary>
    public SampleProcess Sample => _sample ?? throw new InvalidOperationException("The sample has not started.");

    /// <summary>The loopback URL the sample reported, with its real port.</summary>
    public string TcpUrl => Sample.Urls.Single(u => u.StartsWith("http://127.0.0.1:", StringComparison.Ordinal));

    /// <summary>The Unix socket URL the sample reported.</summary>
    public string UnixUrl => Sample.Urls.Single(u => u.StartsWith("http://unix:", StringComparison.Ordinal));

    /// <summary>A client for <see cref="TcpUrl"/> that speaks <see cref="ClientVersion"/> only (h2c with prior knowledge for 2.0).</summary>
    public HttpClient Client => _client ?? throw new InvalidOperationException("The sample has not started.");

    /// <summary>The Date header of the first response.</summary>
    public string FirstDate { get; private set; } = "";

    /// <summary>When the first response arrived (a <see cref="Stopwatch"/> timestamp).</summary>
    public long FirstDateTimestamp { get; private set; }

    /// <summary>What the startup line must match, beyond the mode and URLs.</summary>
    public abstract Regex ExpectedTransport { get; }

    /// <summary>Arguments for the sample beyond the URLs, the transport and the mode.</summary>
    protected virtual IReadOnlyList<string> ExtraArguments => [];

    /// <inheritdoc />
    public async Task InitializeAsync()
    {
        CheckPrerequisites();
        File.Delete(UnixSocketPath);

        string[] protocols = Protocols is null ? [] : ["--protocols", Protocols];
        _sample = await SampleProcess.StartAsync(
            ["--urls", $"http://127.0.0.1:0;http://unix:{UnixSocketPath}", "--transport", Transport, "--mode", Mode, .. protocols, .. ExtraArguments],
            new Dictionary<string, string?>
            {
                // sockets-inline must set this for itself; the others must run without it.
                ["DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS"] = null,
            });

        _client = new HttpClient(new SocketsHttpHandler { AllowAutoRedirect = false, UseCookies = false })
        {
            BaseAddress = new Uri(TcpUrl),
            Timeout = TestTimeouts.Request,
            DefaultRequestVersion = ClientVersion,
            DefaultVersionPolicy = HttpVersionPolicy.RequestVersionExact,
        };

        using var first = await _client.GetAsync(new Uri("/plaintext", UriKind.Relative));
        first.EnsureSuccessStatusCode();
        FirstDateTimestamp = Stopwatch.GetTimestamp();
        FirstDate = first.Headers.NonValidated["Date"].ToString();
    }

    /// <inheritdoc />
    Task IAsyncLifetime.DisposeAsync() => DisposeAsync().AsTask();

    /// <inheritdoc />
    public async ValueTask DisposeAsync()
    {
        _client?.Dispose();
        if (_sample is not null)
        {
            await _sample.DisposeAsync();
        }

        File.Delete(UnixSocketPath);
        GC.SuppressFinalize(this);
    }

    /// <summary>Fails start-up with an actionable message when the machine lacks something.</summary>
    protected virtual void CheckPrerequisites()
    {
    }
}

/// <summary>The Linux transport (the sample's default) with its own defaults: Adaptive scheduling on epoll.</summary>
public abstract class LinuxFixture(string mode, string? protocols = null) : SampleFixture("linux", mode, protocols)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } = new(@"^TechEmpower: transport=linux threads=\d+ scheduling=Adaptive io=Epoll ");
}

/// <summary>
/// The Linux transport with the Linux AIO backend (<c>--io aio</c>), and the loop making every send (the benchmarks-only
/// <c>--tuning SendFromThreadPool=false</c>), so that receives and sends both go through io_submit.
/// </summary>
public abstract class LinuxAioFixture(string mode) : SampleFixture("linux", mode)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } =
        new(@"^TechEmpower: transport=linux threads=\d+ scheduling=Adaptive io=EpollAio tuning=SendFromThreadPool=false ");

    /// <inheritdoc />
    protected override IReadOnlyList<string> ExtraArguments => ["--io", "aio", "--tuning", "SendFromThreadPool=false"];
}

/// <summary>The Linux transport on its io_uring engine (<c>--io io_uring</c>), with the sample's other defaults (Adaptive
/// scheduling, so each ring is set up so that it can follow its loop to another thread).</summary>
public abstract class LinuxIoUringFixture(string mode, string? protocols = null) : SampleFixture("linux", mode, protocols)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } = new(@"^TechEmpower: transport=linux threads=\d+ scheduling=Adaptive io=IoUring ");

    /// <inheritdoc />
    protected override IReadOnlyList<string> ExtraArguments => ["--io", "io_uring"];
}

/// <summary>The Linux transport with ThreadPool scheduling (<c>--scheduling threadpool</c>), with the sample's other defaults.</summary>
public abstract class LinuxThreadPoolFixture(string mode, string? protocols = null) : SampleFixture("linux", mode, protocols)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } = new(@"^TechEmpower: transport=linux threads=\d+ scheduling=ThreadPool io=Epoll ");

    /// <inheritdoc />
    protected override IReadOnlyList<string> ExtraArguments => ["--scheduling", "threadpool"];
}

/// <summary>
/// The Linux transport with ThreadPool scheduling on io_uring (<c>--scheduling threadpool --io io_uring</c>): each ring is
/// set up for one thread (SINGLE_ISSUER), which the default Adaptive scheduling cannot use.
/// </summary>
public abstract class LinuxIoUringThreadPoolFixture(string mode, string? protocols = null) : SampleFixture("linux", mode, protocols)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } = new(@"^TechEmpower: transport=linux threads=\d+ scheduling=ThreadPool io=IoUring ");

    /// <inheritdoc />
    protected override IReadOnlyList<string> ExtraArguments => ["--scheduling", "threadpool", "--io", "io_uring"];
}

/// <summary>Kestrel's Sockets transport, default options.</summary>
public abstract class SocketsFixture(string mode, string? protocols = null) : SampleFixture("sockets", mode, protocols)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } =
        new(@"^TechEmpower: transport=sockets threads=\d+ scheduling=ThreadPool socket-completions=threadpool ");
}

/// <summary>The Sockets transport with inline scheduling and inline socket completions, which the sample turns on itself.</summary>
public abstract class SocketsInlineFixture(string mode) : SampleFixture("sockets-inline", mode)
{
    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } =
        new(@"^TechEmpower: transport=sockets-inline threads=\d+ scheduling=Inline socket-completions=inline ");
}

/// <summary>The libuv comparator, which needs the system's libuv1.</summary>
public abstract class LibuvFixture(string mode) : SampleFixture("libuv", mode)
{
    /// <summary>What to do when libuv is missing.</summary>
    public const string InstallHint = "libuv.so.1 cannot be loaded: install it with 'apt-get install libuv1' (.ci/run installs it).";

    /// <inheritdoc />
    public override Regex ExpectedTransport { get; } =
        new(@"^TechEmpower: transport=libuv \(libuv \d+\.\d+\.\d+ comparator\) threads=\d+ ");

    /// <summary>Fails with <see cref="InstallHint"/> unless libuv.so.1 loads.</summary>
    public static void RequireLibuv()
    {
        if (!NativeLibrary.TryLoad("libuv.so.1", out var handle))
        {
            throw new InvalidOperationException(InstallHint);
        }

        NativeLibrary.Free(handle);
    }

    /// <inheritdoc />
    protected override void CheckPrerequisites() => RequireLibuv();
}

#pragma warning disable CA1711 // The suffix says what these are: xunit class fixtures.
public sealed class LinuxMiddlewareFixture() : LinuxFixture("middleware");

public sealed class LinuxPlatformFixture() : LinuxFixture("platform");

public sealed class LinuxAioPlatformFixture() : LinuxAioFixture("platform");

public sealed class LinuxIoUringMiddlewareFixture() : LinuxIoUringFixture("middleware");

public sealed class LinuxThreadPoolMiddlewareFixture() : LinuxThreadPoolFixture("middleware");

public sealed class LinuxThreadPoolPlatformFixture() : LinuxThreadPoolFixture("platform");

public sealed class LinuxIoUringPlatformFixture() : LinuxIoUringFixture("platform");

public sealed class SocketsMiddlewareFixture() : SocketsFixture("middleware");

public sealed class SocketsPlatformFixture() : SocketsFixture("platform");

public sealed class SocketsInlineMiddlewareFixture() : SocketsInlineFixture("middleware");

public sealed class SocketsInlinePlatformFixture() : SocketsInlineFixture("platform");

public sealed class LibuvMiddlewareFixture() : LibuvFixture("middleware");

public sealed class LibuvPlatformFixture() : LibuvFixture("platform");

public sealed class LinuxH2cFixture() : LinuxFixture("middleware", "http2");

public sealed class LinuxThreadPoolH2cFixture() : LinuxThreadPoolFixture("middleware", "http2");

public sealed class LinuxIoUringH2cFixture() : LinuxIoUringFixture("middleware", "http2");

public sealed class LinuxIoUringThreadPoolH2cFixture() : LinuxIoUringThreadPoolFixture("middleware", "http2");

public sealed class SocketsH2cFixture() : SocketsFixture("middleware", "http2");
#pragma warning restore CA1711
