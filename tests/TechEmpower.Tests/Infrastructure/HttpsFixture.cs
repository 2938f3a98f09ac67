using System.Net;
using System.Text.RegularExpressions;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>
/// One running sample per transport in middleware mode with TLS and a downstream: listening on
/// <c>https://127.0.0.1:0</c> (the self-signed certificate it makes at start-up, ALPN offering h2 and http/1.1) and on
/// <c>http://127.0.0.1:0</c>, with <c>--downstream</c> pointing at a <see cref="Downstream"/> server in the test process.
/// </summary>
public abstract class HttpsFixture : IAsyncLifetime, IAsyncDisposable
{
    private readonly string[] _arguments;
    private SampleProcess? _sample;
    private Downstream? _downstream;
    private HttpClient? _https1;
    private HttpClient? _https2;
    private HttpClient? _http;

    /// <summary>Configures the sample to start.</summary>
    /// <param name="expectedTransport">What the startup line must match, ahead of the mode.</param>
    /// <param name="arguments">The transport's arguments (<c>--transport</c> and the like).</param>
    protected HttpsFixture(string expectedTransport, params string[] arguments)
    {
        ExpectedTransport = new Regex(expectedTransport);
        _arguments = arguments;
    }

    /// <summary>What the startup line must match, ahead of the mode.</summary>
    public Regex ExpectedTransport { get; }

    /// <summary>The running sample.</summary>
    public SampleProcess Sample => _sample ?? throw new InvalidOperationException("The sample has not started.");

    /// <summary>The sample's downstream.</summary>
    public Downstream Downstream => _downstream ?? throw new InvalidOperationException("The downstream has not started.");

    /// <summary>The https:// URL the sample reported, with its real port.</summary>
    public string HttpsUrl => Sample.Urls.Single(u => u.StartsWith("https://127.0.0.1:", StringComparison.Ordinal));

    /// <summary>The http:// URL the sample reported, with its real port.</summary>
    public string HttpUrl => Sample.Urls.Single(u => u.StartsWith("http://127.0.0.1:", StringComparison.Ordinal));

    /// <summary>Checks the certificates behind <see cref="Https1"/> and <see cref="Https2"/>.</summary>
    public TlsClient Tls { get; } = TlsClient.SelfSigned();

    /// <summary>HTTP/1.1 over TLS to <see cref="HttpsUrl"/>.</summary>
    public HttpClient Https1 => _https1 ?? throw new InvalidOperationException("The sample has not started.");

    /// <summary>HTTP/2 over TLS to <see cref="HttpsUrl"/>.</summary>
    public HttpClient Https2 => _https2 ?? throw new InvalidOperationException("The sample has not started.");

    /// <summary>HTTP/1.1 to <see cref="HttpUrl"/>.</summary>
    public HttpClient Http => _http ?? throw new InvalidOperationException("The sample has not started.");

    /// <inheritdoc />
    public async Task InitializeAsync()
    {
        CheckPrerequisites();
        _downstream = await Downstream.StartAsync();
        _sample = await SampleProcess.StartAsync(
            ["--urls", "https://127.0.0.1:0;http://127.0.0.1:0", "--mode", "middleware", "--downstream", _downstream.Url, .. _arguments],
            new Dictionary<string, string?> { ["DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS"] = null });

        _https1 = Tls.HttpClient(HttpsUrl, HttpVersion.Version11);
        _https2 = Tls.HttpClient(HttpsUrl, HttpVersion.Version20);
        _http = new HttpClient(new SocketsHttpHandler { AllowAutoRedirect = false, UseCookies = false })
        {
            BaseAddress = new Uri(HttpUrl),
            Timeout = TestTimeouts.Request,
        };
    }

    /// <inheritdoc />
    Task IAsyncLifetime.DisposeAsync() => DisposeAsync().AsTask();

    /// <inheritdoc />
    public async ValueTask DisposeAsync()
    {
        _https1?.Dispose();
        _https2?.Dispose();
        _http?.Dispose();
        if (_sample is not null)
        {
            await _sample.DisposeAsync();
        }

        if (_downstream is not null)
        {
            await _downstream.DisposeAsync();
        }

        GC.SuppressFinalize(this);
    }

    /// <summary>Fails start-up with an actionable message when the machine lacks something.</summary>
    protected virtual void CheckPrerequisites()
    {
    }
}

#pragma warning disable CA1711 // The suffix says what these are: xunit class fixtures.
public sealed class LinuxHttpsFixture() : HttpsFixture(@"^TechEmpower: transport=linux threads=\d+ scheduling=Adaptive io=Epoll ", "--transport", "linux");

public sealed class LinuxThreadPoolHttpsFixture() : HttpsFixture(
    @"^TechEmpower: transport=linux threads=\d+ scheduling=ThreadPool io=Epoll ", "--transport", "linux", "--scheduling", "threadpool");

public sealed class LinuxInlineHttpsFixture() : HttpsFixture(
    @"^TechEmpower: transport=linux threads=\d+ scheduling=Inline io=Epoll ", "--transport", "linux", "--scheduling", "inline");

public sealed class LinuxIoUringHttpsFixture() : HttpsFixture(
    @"^TechEmpower: transport=linux threads=\d+ scheduling=Adaptive io=IoUring ", "--transport", "linux", "--io", "io_uring");

public sealed class LinuxIoUringThreadPoolHttpsFixture() : HttpsFixture(
    @"^TechEmpower: transport=linux threads=\d+ scheduling=ThreadPool io=IoUring ", "--transport", "linux", "--scheduling", "threadpool", "--io", "io_uring");

public sealed class SocketsHttpsFixture() : HttpsFixture(
    @"^TechEmpower: transport=sockets threads=\d+ scheduling=ThreadPool socket-completions=threadpool ", "--transport", "sockets");

public sealed class SocketsInlineHttpsFixture() : HttpsFixture(
    @"^TechEmpower: transport=sockets-inline threads=\d+ scheduling=Inline socket-completions=inline ", "--transport", "sockets-inline");

public sealed class LibuvHttpsFixture() : HttpsFixture(@"^TechEmpower: transport=libuv \(libuv \d+\.\d+\.\d+ comparator\) threads=\d+ ", "--transport", "libuv")
{
    /// <inheritdoc />
    protected override void CheckPrerequisites() => LibuvFixture.RequireLibuv();
}
#pragma warning restore CA1711
