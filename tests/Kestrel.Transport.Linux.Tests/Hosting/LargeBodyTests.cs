using System.Net;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>100 MB each way through Kestrel, checked end to end with SHA-256.</summary>
public sealed class LargeBodyTests(ITestOutputHelper output)
{
    private const long HundredMegabytes = 100L * 1024 * 1024;
    private const ulong Seed = 100;

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task A_chunked_100_MB_upload_arrives_intact(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, HashRequestBody, s => s.Kestrel = k => k.Limits.MaxRequestBodySize = null);
        using var client = new HttpClient { Timeout = TestTimeouts.Large };

        var content = new GeneratedContent(Seed, HundredMegabytes);
        using var response = await client.PostAsync(new Uri(host.Address, "/upload"), content).WaitAsync(TestTimeouts.Large);
        var answer = await response.Content.ReadAsStringAsync();
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);

        // The server saw a chunked body with exactly the bytes the client generated.
        Assert.Equal($"chunked {HundredMegabytes} {content.SentSha256}", answer);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task A_100_MB_download_arrives_intact(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, context => WriteGeneratedAsync(context, HundredMegabytes));
        using var client = new HttpClient { Timeout = TestTimeouts.Large };

        using var response = await client.GetAsync(new Uri(host.Address, "/download"), HttpCompletionOption.ResponseHeadersRead).WaitAsync(TestTimeouts.Default);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(HundredMegabytes, response.Content.Headers.ContentLength);
        var (length, sha256) = await HashAsync(await response.Content.ReadAsStreamAsync()).WaitAsync(TestTimeouts.Large);

        Assert.Equal(HundredMegabytes, length);
        Assert.Equal(TestData.Sha256(Seed, HundredMegabytes), sha256);
        await host.StopAsync();
    }

    internal static async Task WriteGeneratedAsync(HttpContext context, long length)
    {
        context.Response.ContentLength = length;
        var chunk = new byte[64 * 1024];
        for (long position = 0; position < length; position += chunk.Length)
        {
            var size = (int)Math.Min(chunk.Length, length - position);
            TestData.Fill(Seed, position, chunk.AsSpan(0, size));
            await context.Response.Body.WriteAsync(chunk.AsMemory(0, size), context.RequestAborted);
        }
    }

    internal static async Task<(long Length, string Sha256)> HashAsync(Stream stream)
    {
        var hash = new StreamHash();
        var buffer = new byte[64 * 1024];
        int n;
        while ((n = await stream.ReadAsync(buffer)) > 0)
        {
            hash.Append(buffer.AsSpan(0, n));
        }

        return (hash.Length, hash.Finish());
    }

    private static async Task HashRequestBody(HttpContext context)
    {
        var (length, sha256) = await HashAsync(context.Request.Body);
        await context.Response.WriteAsync($"{context.Request.Headers.TransferEncoding} {length} {sha256}");
    }

    /// <summary>A body of unknown length (so HttpClient sends it chunked) that hashes what it sends.</summary>
    private sealed class GeneratedContent(ulong seed, long length) : HttpContent
    {
        public string? SentSha256 { get; private set; }

        protected override async Task SerializeToStreamAsync(Stream stream, TransportContext? context)
        {
            var hash = new StreamHash();
            var chunk = new byte[64 * 1024];
            for (long position = 0; position < length; position += chunk.Length)
            {
                var size = (int)Math.Min(chunk.Length, length - position);
                TestData.Fill(seed, position, chunk.AsSpan(0, size));
                hash.Append(chunk.AsSpan(0, size));
                await stream.WriteAsync(chunk.AsMemory(0, size));
            }

            SentSha256 = hash.Finish();
        }

        protected override bool TryComputeLength(out long length)
        {
            length = 0;
            return false;
        }
    }
}
