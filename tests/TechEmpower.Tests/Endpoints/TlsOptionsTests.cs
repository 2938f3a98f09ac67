using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Security.Authentication;
using System.Text;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// The TLS options, each on a sample of its own: a certificate given as a PFX or as PEM files is the one served;
/// <c>--protocols</c> restricts what ALPN offers; an IPv6 https:// URL; /await with its downstream down.
/// </summary>
public sealed class TlsOptionsTests
{
    private const string HelloWorldJson = """{"message":"Hello, World!"}""";

    public static TheoryData<string, bool> CertificateFiles => new()
    {
        { "pfx", true },
        { "pem-pair", true },
        { "pem-pair", false },
        { "pem-encrypted-key", false },
        { "pem-one-file", false },
    };

    [Theory]
    [MemberData(nameof(CertificateFiles))]
    public async Task A_certificate_given_by_path_is_the_one_served(string form, bool rsa)
    {
        using var files = TestCertificates.Create(rsa);
        string[] certificate = form switch
        {
            "pfx" => ["--certificate", files.Pfx, "--certificate-password", TestCertificates.Password],
            "pem-pair" => ["--certificate", files.CertificatePem, "--certificate-key", files.KeyPem],
            "pem-encrypted-key" => ["--certificate", files.CertificatePem, "--certificate-key", files.EncryptedKeyPem, "--certificate-password", TestCertificates.Password],
            _ => ["--certificate", files.CombinedPem],
        };
        await using var sample = await SampleProcess.StartAsync(["--urls", "https://127.0.0.1:0", .. certificate]);
        Assert.Contains($" certificate=file:{(rsa ? "RSA-2048" : "ECDSA-384")} urls=https://127.0.0.1:", sample.StartupLine, StringComparison.Ordinal);

        var tls = TlsClient.Expect(files.Certificate);
        using var client = tls.HttpClient(sample.Urls.Single(), HttpVersion.Version11);
        using var response = await client.GetAsync(new Uri("/json", UriKind.Relative));
        var body = await TechEmpowerRules.VerifyAsync(response, "application/json");

        Assert.Equal(HelloWorldJson, Encoding.UTF8.GetString(body));
        Assert.True(tls.Refusals.Length == 0, tls.Refusals);
        Assert.Equal(files.Certificate.Thumbprint, Assert.Single(tls.Presented).Thumbprint);
    }

    [Theory]
    [InlineData("http1", "http/1.1")]
    [InlineData("http2", "h2")]
    [InlineData("http1andhttp2", "h2")]
    public async Task Protocols_decide_what_ALPN_picks_for_a_client_that_offers_both(string protocols, string expected)
    {
        await using var sample = await SampleProcess.StartAsync(["--urls", "https://127.0.0.1:0", "--protocols", protocols]);
        using var cts = new CancellationTokenSource(TestTimeouts.Request);
        await using var stream = await TlsClient.SelfSigned().ConnectAsync(
            sample.Urls.Single(), [SslApplicationProtocol.Http2, SslApplicationProtocol.Http11], cts.Token);

        Assert.Equal(expected, stream.NegotiatedApplicationProtocol.ToString());
    }

    /// <summary>An HTTP/2-only endpoint takes no client that cannot speak it: the handshake fails, rather than serve HTTP/1.1.</summary>
    [Fact]
    public async Task Protocols_http2_refuses_a_client_that_offers_http11_only()
    {
        await using var sample = await SampleProcess.StartAsync(["--urls", "https://127.0.0.1:0", "--protocols", "http2"]);
        using var cts = new CancellationTokenSource(TestTimeouts.Request);

        await Assert.ThrowsAsync<AuthenticationException>(
            () => TlsClient.SelfSigned().ConnectAsync(sample.Urls.Single(), [SslApplicationProtocol.Http11], cts.Token));
    }

    [IPv6Fact]
    public async Task An_ipv6_https_url_serves_the_self_signed_certificate_which_names_the_ipv6_loopback()
    {
        await using var sample = await SampleProcess.StartAsync(["--urls", "https://[::1]:0"]);
        var url = sample.Urls.Single();
        Assert.StartsWith("https://[::1]:", url, StringComparison.Ordinal);

        // The client checks the name against the URL's host, ::1: a certificate without it would be refused.
        var tls = TlsClient.SelfSigned();
        using var client = tls.HttpClient(url, HttpVersion.Version20);
        using var response = await client.GetAsync(new Uri("/json", UriKind.Relative));

        Assert.True(tls.Refusals.Length == 0, tls.Refusals);
        Assert.Equal(HttpVersion.Version20, response.Version);
        Assert.Equal(HelloWorldJson, await response.Content.ReadAsStringAsync());
    }

    [Theory]
    [InlineData("linux")]
    [InlineData("sockets")]
    public async Task Await_answers_502_when_the_downstream_is_down(string transport)
    {
        // A port bound but not listening: connections to it are refused, and no other process can take it meanwhile.
        using var reserved = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        reserved.Bind(new IPEndPoint(IPAddress.Loopback, 0));
        await using var sample = await SampleProcess.StartAsync(
            ["--urls", "http://127.0.0.1:0", "--transport", transport, "--downstream", $"http://{reserved.LocalEndPoint}/json"]);
        using var client = new HttpClient { BaseAddress = new Uri(sample.Urls.Single()), Timeout = TestTimeouts.Request };

        using var response = await client.GetAsync(new Uri("/await", UriKind.Relative));

        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        Assert.StartsWith("downstream call failed: Connection refused", await response.Content.ReadAsStringAsync(), StringComparison.Ordinal);
    }
}
