using System.Net;
using System.Security.Cryptography;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// Apps that block: synchronous body reads and writes (AllowSynchronousIO) wait on continuations the
/// transport schedules. The default ThreadPool scheduling must never leave such a wait stuck behind the
/// very thread that waits, even with one loop and every buffer small enough to hit backpressure.
/// </summary>
public sealed class SynchronousIoTests(ITestOutputHelper output)
{
    private const int Length = 8 * 1024 * 1024;

    // Every kind but the inline ones: Inline scheduling runs the app on the loop thread, and an app that
    // blocks there waits for the loop it is blocking. That is Inline's documented contract.
    [Theory]
    [MemberData(nameof(Transports.AllowBlocking), MemberType = typeof(Transports))]
    public async Task Blocking_reads_and_writes_complete_under_backpressure(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, EchoSynchronously, s =>
        {
            s.Kestrel = k =>
            {
                k.AllowSynchronousIO = true;
                k.Limits.MaxRequestBodySize = null;
                k.Limits.MaxRequestBufferSize = 64 * 1024;
                k.Limits.MaxResponseBufferSize = 64 * 1024;
            };
            s.Linux = o =>
            {
                o.ThreadCount = 1;
                o.MaxReadBufferSize = 64 * 1024;
                o.MaxWriteBufferSize = 64 * 1024;
            };
        });

        using var client = new HttpClient { Timeout = TestTimeouts.Large };
        var body = TestData.Create(seed: 7, Length);

        // Several at once, so that one loop's dispatch batch holds more than one blocked request.
        var requests = Enumerable.Range(0, 4).Select(async _ =>
        {
            using var response = await client.PostAsync(new Uri(host.Address, "/echo"), new ByteArrayContent(body));
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
            var echoed = await response.Content.ReadAsByteArrayAsync();
            Assert.Equal(SHA256.HashData(body), SHA256.HashData(echoed));
        });

        await Task.WhenAll(requests).WaitAsync(TestTimeouts.Large);
        await host.StopAsync();
    }

    private static Task EchoSynchronously(HttpContext context)
    {
        var buffer = new byte[16 * 1024];
        var received = new MemoryStream();
        int read;
        while ((read = context.Request.Body.Read(buffer)) > 0)
        {
            received.Write(buffer, 0, read);
        }

        context.Response.ContentLength = received.Length;
        var data = received.GetBuffer();
        for (int offset = 0; offset < received.Length; offset += buffer.Length)
        {
            context.Response.Body.Write(data, offset, (int)Math.Min(buffer.Length, received.Length - offset));
        }

        return Task.CompletedTask;
    }
}
