using System.Net;
using System.Net.Security;
using System.Text;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// Middleware mode over TLS, on every transport: the TechEmpower plaintext and JSON tests as the verifier checks them, with
/// the self-signed certificate the sample makes for itself; HTTP/2 and HTTP/1.1 as ALPN picks them for h2load and wrk; and
/// (HttpsEndpoints.Await.cs) the awaiting handler, GET /await.
/// </summary>
/// <typeparam name="TFixture">The running sample.</typeparam>
/// <param name="sample">The running sample.</param>
public abstract partial class HttpsEndpoints<TFixture>(TFixture sample) : IClassFixture<TFixture>
    where TFixture : HttpsFixture
{
    private const string HelloWorld = "Hello, World!";
    private const string HelloWorldJson = """{"message":"Hello, World!"}""";

    private TFixture Sample { get; } = sample;

    [Fact]
    public void Startup_line_names_the_transport_the_self_signed_certificate_and_the_https_url()
    {
        var line = Sample.Sample.StartupLine;
        Assert.Matches(Sample.ExpectedTransport, line);
        Assert.Contains(" mode=middleware certificate=self-signed:ECDSA-256 urls=", line, StringComparison.Ordinal);
        Assert.Matches(@"^https://127\.0\.0\.1:[1-9]\d*$", Sample.HttpsUrl);
    }

    [Fact]
    public async Task Plaintext_over_tls_follows_the_TechEmpower_rules()
    {
        using var response = await Sample.Https1.GetAsync(new Uri("/plaintext", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "text/plain");
        Assert.Equal(HelloWorld, Encoding.UTF8.GetString(body));
        AssertOnlySelfSignedPresented();
    }

    [Fact]
    public async Task Json_over_tls_follows_the_TechEmpower_rules()
    {
        using var response = await Sample.Https1.GetAsync(new Uri("/json", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "application/json");
        Assert.Equal(HelloWorldJson, Encoding.UTF8.GetString(body));
        AssertOnlySelfSignedPresented();
    }

    [Fact]
    public async Task The_certificate_is_the_self_signed_one_for_localhost_and_both_loopback_addresses()
    {
        using var cts = new CancellationTokenSource(TestTimeouts.Request);
        await using var stream = await Sample.Tls.ConnectAsync(Sample.HttpsUrl, [], cts.Token);

        var certificate = Assert.IsType<System.Security.Cryptography.X509Certificates.X509Certificate2>(stream.RemoteCertificate, exactMatch: false);
        Assert.Null(TlsClient.WhyNotSelfSigned(certificate));
        AssertOnlySelfSignedPresented();
    }

    [Fact]
    public async Task Http2_over_tls_is_what_ALPN_picks_for_a_client_that_offers_h2_first()
    {
        // h2load's offer.
        using var cts = new CancellationTokenSource(TestTimeouts.Request);
        await using (var stream = await Sample.Tls.ConnectAsync(Sample.HttpsUrl, [SslApplicationProtocol.Http2, SslApplicationProtocol.Http11], cts.Token))
        {
            Assert.Equal(SslApplicationProtocol.Http2, stream.NegotiatedApplicationProtocol);
        }

        using var response = await Sample.Https2.GetAsync(new Uri("/json", UriKind.Relative));
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(HttpVersion.Version20, response.Version);
        Assert.Equal("application/json", response.Content.Headers.ContentType?.MediaType);
        Assert.Equal(HelloWorldJson, await response.Content.ReadAsStringAsync());
        AssertOnlySelfSignedPresented();
    }

    /// <summary>wrk offers no ALPN: the connection speaks HTTP/1.1, and 16 pipelined requests are all answered, as TechEmpower sends them.</summary>
    [Fact]
    public async Task A_client_without_ALPN_gets_http1_and_sixteen_pipelined_requests_answered()
    {
        using var cts = new CancellationTokenSource(TestTimeouts.Request);
        await using var stream = await Sample.Tls.ConnectAsync(Sample.HttpsUrl, [], cts.Token);
        Assert.Equal(default, stream.NegotiatedApplicationProtocol);

        var request = "GET /plaintext HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n";
        await stream.WriteAsync(Encoding.ASCII.GetBytes(string.Concat(Enumerable.Repeat(request, 16))), cts.Token);
        var text = await TlsClient.ReadResponsesAsync(stream, HelloWorld, 16, cts.Token);

        Assert.Equal(16, TlsClient.Occurrences(text, "HTTP/1.1 200 OK\r\n"));
        Assert.Equal(16, TlsClient.Occurrences(text, "Content-Type: text/plain\r\n"));
        AssertOnlySelfSignedPresented();
    }

    private void AssertOnlySelfSignedPresented()
    {
        Assert.True(Sample.Tls.Refusals.Length == 0, $"Refused: {Sample.Tls.Refusals}");
        Assert.NotEmpty(Sample.Tls.Presented);
        Assert.Single(Sample.Tls.Presented.Select(c => c.Thumbprint).Distinct());
    }
}

// One test class per transport and scheduling: each runs its own sample (its class fixture), in parallel with the others.

public sealed class Linux_https(LinuxHttpsFixture sample) : HttpsEndpoints<LinuxHttpsFixture>(sample);

public sealed class Linux_threadpool_https(LinuxThreadPoolHttpsFixture sample) : HttpsEndpoints<LinuxThreadPoolHttpsFixture>(sample);

public sealed class Linux_inline_https(LinuxInlineHttpsFixture sample) : HttpsEndpoints<LinuxInlineHttpsFixture>(sample);

public sealed class Linux_io_uring_https(LinuxIoUringHttpsFixture sample) : HttpsEndpoints<LinuxIoUringHttpsFixture>(sample);

public sealed class Linux_io_uring_threadpool_https(LinuxIoUringThreadPoolHttpsFixture sample) : HttpsEndpoints<LinuxIoUringThreadPoolHttpsFixture>(sample);

public sealed class Sockets_https(SocketsHttpsFixture sample) : HttpsEndpoints<SocketsHttpsFixture>(sample);

public sealed class Sockets_inline_https(SocketsInlineHttpsFixture sample) : HttpsEndpoints<SocketsInlineHttpsFixture>(sample);

public sealed class Libuv_https(LibuvHttpsFixture sample) : HttpsEndpoints<LibuvHttpsFixture>(sample);
