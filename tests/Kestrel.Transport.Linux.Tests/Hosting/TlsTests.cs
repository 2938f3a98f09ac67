using System.Net;
using System.Runtime.CompilerServices;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Core;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>TLS over the transport, and HTTP/2 negotiated by ALPN.</summary>
public sealed class TlsTests(ITestOutputHelper output)
{
    private const long DownloadLength = 8L * 1024 * 1024;

    private static readonly RequestDelegate s_app = context => context.Request.Path.StartsWithSegments("/download")
        ? LargeBodyTests.WriteGeneratedAsync(context, DownloadLength)
        : context.Response.WriteAsync($"{context.Request.IsHttps} {context.Request.Protocol} {context.Request.Path}");

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task HTTPS_with_a_self_signed_certificate_serves_the_client_that_trusts_exactly_it(TransportKind kind)
    {
        using var certificate = TestCertificate.Create();
        await using var host = await TestHost.StartAsync(kind, output, s_app, s => s.Listen = listen => listen.UseHttps(certificate));
        Assert.Equal("https", host.Address.Scheme);

        var validations = new StrongBox<int>();
        using var client = new HttpClient(TestCertificate.CreateHandlerTrusting(certificate, validations)) { Timeout = TestTimeouts.Large };

        using (var response = await client.GetAsync(new Uri(host.Address, "/hello")).WaitAsync(TestTimeouts.Default))
        {
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
            Assert.Equal(HttpVersion.Version11, response.Version);
            Assert.Equal("True HTTP/1.1 /hello", await response.Content.ReadAsStringAsync());
        }

        // Enough records to fill the socket buffers many times over.
        using (var response = await client.GetAsync(new Uri(host.Address, "/download"), HttpCompletionOption.ResponseHeadersRead).WaitAsync(TestTimeouts.Default))
        {
            var (length, sha256) = await LargeBodyTests.HashAsync(await response.Content.ReadAsStreamAsync()).WaitAsync(TestTimeouts.Large);
            Assert.Equal(DownloadLength, length);
            Assert.Equal(TestData.Sha256(100, DownloadLength), sha256);
        }

        Assert.True(validations.Value >= 1, "The certificate validation callback never ran, so the test did not check the server's certificate.");
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task HTTP2_is_negotiated_by_ALPN_and_multiplexes_concurrent_requests(TransportKind kind)
    {
        using var certificate = TestCertificate.Create();
        await using var host = await TestHost.StartAsync(kind, output, s_app, s => s.Listen = listen =>
        {
            listen.Protocols = HttpProtocols.Http1AndHttp2;
            listen.UseHttps(certificate);
        });

        var validations = new StrongBox<int>();
        using var client = new HttpClient(TestCertificate.CreateHandlerTrusting(certificate, validations))
        {
            DefaultRequestVersion = HttpVersion.Version20,
            DefaultVersionPolicy = HttpVersionPolicy.RequestVersionExact,
            Timeout = TestTimeouts.Large,
        };

        var requests = Enumerable.Range(0, 32).Select(async i =>
        {
            using var response = await client.GetAsync(new Uri(host.Address, $"/stream/{i}"));
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
            Assert.Equal(HttpVersion.Version20, response.Version);
            Assert.Equal($"True HTTP/2 /stream/{i}", await response.Content.ReadAsStringAsync());
        });
        await Task.WhenAll(requests).WaitAsync(TestTimeouts.Default);

        using (var response = await client.GetAsync(new Uri(host.Address, "/download"), HttpCompletionOption.ResponseHeadersRead).WaitAsync(TestTimeouts.Default))
        {
            Assert.Equal(HttpVersion.Version20, response.Version);
            var (length, sha256) = await LargeBodyTests.HashAsync(await response.Content.ReadAsStreamAsync()).WaitAsync(TestTimeouts.Large);
            Assert.Equal(DownloadLength, length);
            Assert.Equal(TestData.Sha256(100, DownloadLength), sha256);
        }

        Assert.True(validations.Value >= 1, "The certificate validation callback never ran.");
        await host.StopAsync();
    }
}
