using System.Globalization;
using System.Net;
using System.Text;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Integrity;

/// <summary>
/// Every byte that crosses the transport is checked end to end: uploads and downloads by SHA-256, pipelined
/// responses by order and content, echoed bodies byte for byte, whatever the sizes, framing and send splits.
/// </summary>
public sealed class NoDataLostTests(ITestOutputHelper output)
{
    private const int Connections = 64;
    private const int MaxTransferSize = 8 * 1024 * 1024;

    public static TheoryData<TransportKind> Kinds =>
        new()
        {
            TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxInline, TransportKind.LinuxManaged,
            TransportKind.LinuxAio, TransportKind.LinuxImmediateSend, TransportKind.LinuxZeroCopy, TransportKind.LinuxIoUring,
            TransportKind.LinuxIoUringZeroCopy,
        };

    /// <summary>
    /// 64 connections each run four transfers of a random size from 1 B to 8 MB (log-uniform, so most are small and
    /// some fill the socket buffers many times), mixing uploads and downloads, chunked and Content-Length; each
    /// body's SHA-256 on the receiving side equals the sender's.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Concurrent_uploads_and_downloads_of_random_sizes_over_64_connections_arrive_intact(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, ServeTransfer, s => s.Kestrel = k => k.Limits.MaxRequestBodySize = null);
        using var handler = new SocketsHttpHandler { MaxConnectionsPerServer = Connections };
        using var client = new HttpClient(handler) { Timeout = TestTimeouts.Large };

        var seed = Environment.TickCount;
        output.WriteLine($"Transfer seed {seed}.");
        long verified = 0;
        var transfers = 0;
        await Task.WhenAll(Enumerable.Range(0, Connections).Select(worker => Task.Run(async () =>
        {
            var random = new Random(seed + worker);
            for (var i = 0; i < 4; i++)
            {
                var length = (long)Math.Round(Math.Exp(random.NextDouble() * Math.Log(MaxTransferSize)));
                var dataSeed = (ulong)random.NextInt64();
                var chunked = random.Next(2) == 0;
                var what = $"{(chunked ? "chunked" : "content-length")} transfer {worker}/{i} of {length} bytes (data seed {dataSeed})";
                if (random.Next(2) == 0)
                {
                    var content = new GeneratedContent(dataSeed, length, chunked);
                    using var response = await client.PostAsync(new Uri(host.Address, "/upload"), content);
                    Assert.Equal(HttpStatusCode.OK, response.StatusCode);
                    var answer = await response.Content.ReadAsStringAsync();
                    Assert.True(answer == $"{length} {content.SentSha256}", $"Upload, {what}: the server received '{answer}'.");
                }
                else
                {
                    using var response = await client.GetAsync(new Uri(host.Address, $"/download?seed={dataSeed}&length={length}&chunked={chunked}"), HttpCompletionOption.ResponseHeadersRead);
                    Assert.Equal(HttpStatusCode.OK, response.StatusCode);
                    Assert.Equal(chunked ? null : length, response.Content.Headers.ContentLength);
                    var (received, sha256) = await HashAsync(await response.Content.ReadAsStreamAsync());
                    Assert.True(received == length && sha256 == TestData.Sha256(dataSeed, length), $"Download, {what}: {received} bytes arrived with a different checksum.");
                }

                Interlocked.Add(ref verified, length);
                Interlocked.Increment(ref transfers);
            }
        }))).WaitAsync(TestTimeouts.Large);

        await host.StopAsync();
        Figures.Report(output, "integrity transfers", kind, $"transfers={transfers} connections={Connections} bytes_sha256_verified={verified}");
    }

    /// <summary>
    /// 64 connections each pipeline 100 requests with distinct ids in one go; the responses (sizes 0–48 KB,
    /// chunked and Content-Length mixed) come back complete, in request order, each echoing its id and carrying
    /// exactly the bytes the id determines.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Sixty_four_connections_pipelining_100_requests_get_every_response_complete_and_in_order(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, ServePipelined);
        long verified = 0;
        await Task.WhenAll(Enumerable.Range(0, Connections).Select(connection => Task.Run(async () =>
        {
            using var socket = await TestSockets.ConnectAsync(host.EndPoint);
            var random = new Random(connection);
            var sizes = Enumerable.Range(0, 100).Select(_ => random.Next(4) == 0 ? random.Next(0, 48 * 1024) : random.Next(0, 2048)).ToArray();
            var requests = new StringBuilder();
            for (var i = 0; i < sizes.Length; i++)
            {
                requests.Append(CultureInfo.InvariantCulture, $"GET /p/{connection}/{i}?size={sizes[i]}&chunked={i % 3 == 0} HTTP/1.1\r\nHost: localhost\r\n\r\n");
            }

            using var cts = new CancellationTokenSource(TestTimeouts.Large);
            var reader = new RawHttpConnection(socket, bufferSize: 64 * 1024);
            var sending = socket.SendAllAsync(Encoding.ASCII.GetBytes(requests.ToString()));
            for (var i = 0; i < sizes.Length; i++)
            {
                var response = await reader.ReadResponseAsync(cts.Token);
                Assert.Equal(200, response.StatusCode);
                Assert.Equal($"{connection}/{i}", response.Value("X-Id"));
                Assert.Equal(i % 3 == 0, response.IsChunked);
                Assert.True(response.Body.AsSpan().SequenceEqual(TestData.Create(PipelinedSeed(connection, i), sizes[i])), $"Connection {connection}, response {i}: {response.Body.Length} bytes, expected {sizes[i]} of its own data.");
                Interlocked.Add(ref verified, response.Body.Length);
            }

            await sending;
        }))).WaitAsync(TestTimeouts.Large);

        await host.StopAsync();
        Figures.Report(output, "integrity pipelined", kind, $"connections={Connections} responses={Connections * 100} body_bytes_verified={verified}");
    }

    /// <summary>
    /// Random binary bodies (all 256 byte values, 1 B–256 KB, Content-Length or chunked with random chunk sizes) are
    /// sent with the request head, cut at random points into sends with small pauses; the echo returns each body
    /// byte for byte, on 16 keep-alive connections at once.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Random_binary_bodies_echo_intact_whatever_the_clients_send_splits(TransportKind kind)
    {
        await using var host = await TestHost.StartAsync(kind, output, Echo);
        var seed = Environment.TickCount;
        output.WriteLine($"Echo seed {seed}.");
        long verified = 0;
        var sends = 0;
        await Task.WhenAll(Enumerable.Range(0, 16).Select(connection => Task.Run(async () =>
        {
            var random = new Random(seed + connection);
            using var socket = await TestSockets.ConnectAsync(host.EndPoint);
            var reader = new RawHttpConnection(socket, bufferSize: 64 * 1024);
            using var cts = new CancellationTokenSource(TestTimeouts.Large);
            for (var n = 0; n < 8; n++)
            {
                var body = new byte[random.Next(4) == 0 ? random.Next(1, 256 * 1024) : random.Next(1, 4096)];
                random.NextBytes(body);
                var chunked = random.Next(2) == 0;
                var request = BuildEchoRequest(random, body, chunked);

                // 1–12 sends, cut anywhere: inside the head, the chunk framing or the body.
                var cuts = Enumerable.Range(0, random.Next(0, 12)).Select(_ => random.Next(1, request.Length)).Distinct().Order().Append(request.Length).ToList();
                var start = 0;
                foreach (var cut in cuts)
                {
                    await socket.SendAllAsync(request.AsMemory(start, cut - start));
                    Interlocked.Increment(ref sends);
                    start = cut;
                    if (random.Next(3) == 0)
                    {
                        await Task.Delay(random.Next(0, 3));
                    }
                }

                var response = await reader.ReadResponseAsync(cts.Token);
                Assert.Equal(200, response.StatusCode);
                Assert.True(response.Body.AsSpan().SequenceEqual(body), $"Connection {connection}, body {n} ({(chunked ? "chunked" : "content-length")}, {body.Length} bytes in {cuts.Count} sends): the echo differs ({response.Body.Length} bytes back).");
                Interlocked.Add(ref verified, body.Length);
            }
        }))).WaitAsync(TestTimeouts.Large);

        await host.StopAsync();
        Figures.Report(output, "integrity echo", kind, $"bodies=128 client_sends={sends} bytes_verified={verified}");
    }

    private static byte[] BuildEchoRequest(Random random, byte[] body, bool chunked)
    {
        using var request = new MemoryStream();
        if (!chunked)
        {
            request.Write(Encoding.ASCII.GetBytes($"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: {body.Length}\r\n\r\n"));
            request.Write(body);
            return request.ToArray();
        }

        request.Write(Encoding.ASCII.GetBytes("POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"));
        for (var position = 0; position < body.Length;)
        {
            var size = Math.Min(body.Length - position, random.Next(1, 20000));
            request.Write(Encoding.ASCII.GetBytes($"{size:x}\r\n"));
            request.Write(body, position, size);
            request.Write("\r\n"u8);
            position += size;
        }

        request.Write("0\r\n\r\n"u8);
        return request.ToArray();
    }

    private static ulong PipelinedSeed(int connection, int index) => (ulong)((connection * 1000) + index + 1);

    private static async Task ServeTransfer(HttpContext context)
    {
        if (context.Request.Path == "/upload")
        {
            var (length, sha256) = await HashAsync(context.Request.Body);
            await context.Response.WriteAsync($"{length} {sha256}");
            return;
        }

        var query = context.Request.Query;
        var seed = ulong.Parse(query["seed"]!, CultureInfo.InvariantCulture);
        var total = long.Parse(query["length"]!, CultureInfo.InvariantCulture);
        if (query["chunked"] != "True")
        {
            context.Response.ContentLength = total;
        }

        // Writes of varying size, so that the transport sees every alignment of its buffers.
        var random = new Random((int)seed);
        var chunk = new byte[128 * 1024];
        for (long position = 0; position < total;)
        {
            var size = (int)Math.Min(total - position, random.Next(1, chunk.Length));
            TestData.Fill(seed, position, chunk.AsSpan(0, size));
            await context.Response.Body.WriteAsync(chunk.AsMemory(0, size), context.RequestAborted);
            position += size;
        }
    }

    private static async Task ServePipelined(HttpContext context)
    {
        var parts = context.Request.Path.Value!.Split('/');
        var connection = int.Parse(parts[2], CultureInfo.InvariantCulture);
        var index = int.Parse(parts[3], CultureInfo.InvariantCulture);
        var size = int.Parse(context.Request.Query["size"]!, CultureInfo.InvariantCulture);
        context.Response.Headers["X-Id"] = $"{connection}/{index}";
        if (context.Request.Query["chunked"] != "True")
        {
            context.Response.ContentLength = size;
        }

        var body = TestData.Create(PipelinedSeed(connection, index), size);

        // Two writes when there is room, so a response is sometimes split across flushes.
        var half = size / 2;
        await context.Response.Body.WriteAsync(body.AsMemory(0, half));
        await context.Response.Body.FlushAsync();
        await context.Response.Body.WriteAsync(body.AsMemory(half));
    }

    private static async Task Echo(HttpContext context)
    {
        using var body = new MemoryStream();
        await context.Request.Body.CopyToAsync(body);
        context.Response.ContentLength = body.Length;
        await context.Response.Body.WriteAsync(body.GetBuffer().AsMemory(0, (int)body.Length));
    }

    private static async Task<(long Length, string Sha256)> HashAsync(Stream stream)
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

    /// <summary>A generated body, chunked (unknown length) or with Content-Length, that hashes what it sends.</summary>
    private sealed class GeneratedContent(ulong seed, long bodyLength, bool chunked) : HttpContent
    {
        public string? SentSha256 { get; private set; }

        protected override async Task SerializeToStreamAsync(Stream stream, TransportContext? context)
        {
            var hash = new StreamHash();
            var random = new Random((int)seed);
            var chunk = new byte[128 * 1024];
            for (long position = 0; position < bodyLength;)
            {
                var size = (int)Math.Min(bodyLength - position, random.Next(1, chunk.Length));
                TestData.Fill(seed, position, chunk.AsSpan(0, size));
                hash.Append(chunk.AsSpan(0, size));
                await stream.WriteAsync(chunk.AsMemory(0, size));
                position += size;
            }

            SentSha256 = hash.Finish();
        }

        protected override bool TryComputeLength(out long length)
        {
            length = chunked ? 0 : bodyLength;
            return !chunked;
        }
    }
}
