using System.Collections.Concurrent;
using System.Net;
using System.Runtime.ExceptionServices;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Core;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// HTTP/2 cleartext (prior knowledge): many bidirectional streaming echoes multiplexed on one long-lived
/// connection, and client cancellations in the middle of some of them.
/// </summary>
public sealed class Http2BidirectionalTests(ITestOutputHelper output)
{
    private const int Streams = 64;
    private const int ChunkSize = 8 * 1024;

    /// <summary>How many chunks a stream's writer may be ahead of what its reader has had echoed back.</summary>
    private const int ChunksAhead = 2;

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Sixty_four_concurrent_bidirectional_streams_on_one_connection_echo_intact(TransportKind kind)
    {
        var server = new EchoServer();
        await using var host = await StartAsync(kind, server);
        using var client = CreateClient();

        var allStarted = new StartLine(Streams);
        var streams = Enumerable.Range(0, Streams).Select(i => new ClientStream($"/stream/{i}", StreamSeed(i), StreamLength(i), allStarted, cancel: null)).ToArray();
        await RunAllAsync(client, host, server, streams);

        for (var i = 0; i < Streams; i++)
        {
            Assert.Equal(StreamLength(i), streams[i].Received);
            var outcome = await server.OutcomeAsync($"/stream/{i}");
            Assert.Null(outcome.Failure);
            Assert.Equal(StreamLength(i), outcome.Echoed);
            Assert.False(outcome.Aborted, $"Stream {i} completed, yet its RequestAborted fired.");
        }

        Assert.Equal(Streams, server.MaxActive);
        Assert.Single(server.Connections);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Streams_cancelled_mid_flight_abort_on_the_server_while_the_rest_and_a_later_request_complete(TransportKind kind)
    {
        var server = new EchoServer();
        await using var host = await StartAsync(kind, server);
        using var client = CreateClient();

        // A quarter of the streams are cancelled once half their echo is back: half of those by their token
        // (which also stops their request body), half by disposing the response while the request body is open.
        static CancelBy? CancelOf(int i) => (i % 8) switch
        {
            1 => CancelBy.Token,
            5 => CancelBy.DisposingTheResponse,
            _ => null,
        };

        var allStarted = new StartLine(Streams);
        var streams = Enumerable.Range(0, Streams).Select(i => new ClientStream($"/stream/{i}", StreamSeed(i), StreamLength(i), allStarted, CancelOf(i))).ToArray();
        await RunAllAsync(client, host, server, streams);

        for (var i = 0; i < Streams; i++)
        {
            var outcome = await server.OutcomeAsync($"/stream/{i}");
            if (CancelOf(i) is null)
            {
                Assert.Equal(StreamLength(i), streams[i].Received);
                Assert.Null(outcome.Failure);
                Assert.Equal(StreamLength(i), outcome.Echoed);
                Assert.False(outcome.Aborted, $"Stream {i} was not cancelled, yet its RequestAborted fired.");
            }
            else
            {
                // The client read at least half, and the server's echo ended with an error, not the end of the body.
                Assert.InRange(streams[i].Received, StreamLength(i) / 2, StreamLength(i) - 1);
                Assert.True(outcome.Failure is not null, $"Stream {i} was cancelled, yet the server's echo ended as if the body had.");
                Assert.InRange(outcome.Echoed, streams[i].Received, StreamLength(i) - 1);
                Assert.True(outcome.Aborted, $"Stream {i} was cancelled, yet its handler ended before RequestAborted fired.");
                output.WriteLine($"Stream {i} ({CancelOf(i)}): the server's echo ended with {outcome.Failure.GetType().Name}: {outcome.Failure.Message}");
            }
        }

        Assert.Equal(Streams, server.MaxActive);

        // The connection outlived the resets: a new stream on the same client succeeds over it.
        var later = new ClientStream("/after", StreamSeed(Streams), StreamLength(Streams), allStarted: null, cancel: null);
        await RunAllAsync(client, host, server, [later]);
        Assert.Equal(StreamLength(Streams), later.Received);
        var after = await server.OutcomeAsync("/after");
        Assert.Null(after.Failure);
        Assert.Single(server.Connections);
        await host.StopAsync();
    }

    private static ulong StreamSeed(int stream) => 3000 + (ulong)stream;

    // From 48 KiB up, never a whole number of chunks (nor of the server's reads).
    private static long StreamLength(int stream) => (48 * 1024) + 1 + (stream * 1531L);

    private Task<TestHost> StartAsync(TransportKind kind, EchoServer server) =>
        TestHost.StartAsync(kind, output, server.HandleAsync, s => s.Listen = listen => listen.Protocols = HttpProtocols.Http2);

    private static HttpClient CreateClient() => new()
    {
        DefaultRequestVersion = HttpVersion.Version20,
        DefaultVersionPolicy = HttpVersionPolicy.RequestVersionExact,
        Timeout = TestTimeouts.Large,
    };

    /// <summary>Runs the streams at once; on a timeout, fails with where each unfinished stream stood, on both sides.</summary>
    private static async Task RunAllAsync(HttpClient client, TestHost host, EchoServer server, ClientStream[] streams)
    {
        var tasks = streams.Select(s => s.RunAsync(client, host, server)).ToArray();
        var all = Task.WhenAll(tasks);
        if (await Task.WhenAny(all, Task.Delay(TestTimeouts.Default)) != all)
        {
            var stuck = streams.Where(static s => !s.Finished).Select(s => $"{s.Path}: {s.Stage}, {s.Received} of {s.Length} read back, server: {server.Describe(s.Path)}");
            Assert.Fail($"{streams.Count(static s => !s.Finished)} of {streams.Length} streams did not finish within {TestTimeouts.Default}:{Environment.NewLine}{string.Join(Environment.NewLine, stuck)}");
        }

        if (all.IsFaulted)
        {
            // The stream that failed first, rather than the others it left waiting at the start line.
            var failures = tasks.Where(static t => t.IsFaulted).Select(static t => t.Exception!.InnerException!).ToArray();
            ExceptionDispatchInfo.Throw(failures.FirstOrDefault(static e => e is not StartLineAbandonedException) ?? failures[0]);
        }
    }

    private enum CancelBy
    {
        Token,
        DisposingTheResponse,
    }

    /// <summary>
    /// One bidirectional stream: the request body is written chunk by chunk, never more than
    /// <see cref="ChunksAhead"/> chunks ahead of the echo read back, so the echo must flow while the request is
    /// still being sent. Every stream waits at its start line once its first echo is back, so all of them are
    /// open at once. A stream to cancel is cancelled once half its echo is back.
    /// </summary>
    private sealed class ClientStream(string path, ulong seed, long length, StartLine? allStarted, CancelBy? cancel)
    {
        private volatile string _stage = "not started";

        public string Path => path;

        public long Length => length;

        public string Stage => _stage;

        /// <summary>How many echoed bytes were read back (and checked).</summary>
        public long Received { get; private set; }

        public bool Finished { get; private set; }

        public async Task RunAsync(HttpClient client, TestHost host, EchoServer server)
        {
            using var stop = new CancellationTokenSource(TestTimeouts.Default);
            using var credits = new SemaphoreSlim(ChunksAhead);
            using var request = new HttpRequestMessage(HttpMethod.Post, new Uri(host.Address, path))
            {
                Version = HttpVersion.Version20,
                VersionPolicy = HttpVersionPolicy.RequestVersionExact,
                Content = new DuplexContent(seed, length, credits, stop.Token),
            };

            var reachedStartLine = false;
            HttpResponseMessage? response = null;
            try
            {
                _stage = "waiting for the response headers";
                response = await client.SendAsync(request, HttpCompletionOption.ResponseHeadersRead, stop.Token);
                Assert.Equal(HttpStatusCode.OK, response.StatusCode);
                Assert.Equal(HttpVersion.Version20, response.Version);
                var body = await response.Content.ReadAsStreamAsync(stop.Token);
                var buffer = new byte[ChunkSize];
                var expected = new byte[ChunkSize];
                long credited = 0;
                while (true)
                {
                    _stage = "reading the echo";
                    var n = await body.ReadAsync(buffer, stop.Token);
                    if (n == 0)
                    {
                        _stage = "read to the end";
                        break;
                    }

                    TestData.Fill(seed, Received, expected.AsSpan(0, n));
                    var same = expected.AsSpan(0, n).CommonPrefixLength(buffer.AsSpan(0, n));
                    Assert.True(same == n, $"{path}: the echo differs at offset {Received + same}.");
                    if (Received == 0 && allStarted is not null)
                    {
                        _stage = "waiting at the start line";
                        reachedStartLine = true;
                        await allStarted.SignalAndWaitAsync();
                    }

                    Received += n;

                    // Before any new credit: the writer is then at most ChunksAhead chunks past what was read
                    // before this read, well short of the end, so a cancelled stream's body is never sent whole.
                    if (cancel is { } by && Received >= length / 2)
                    {
                        await CancelAsync(by, server, stop, response, body);
                        break;
                    }

                    for (; credited + ChunkSize <= Received; credited += ChunkSize)
                    {
                        credits.Release();
                    }
                }
            }
            finally
            {
                response?.Dispose();
                if (!reachedStartLine)
                {
                    allStarted?.Abandon(path, _stage);
                }
            }

            Finished = true;
        }

        private async Task CancelAsync(CancelBy by, EchoServer server, CancellationTokenSource stop, HttpResponseMessage response, Stream body)
        {
            if (by == CancelBy.Token)
            {
                // The token the request body and the response read both use: both end, and so does the response.
                _stage = "cancelled by its token";
                await stop.CancelAsync();
                await Assert.ThrowsAnyAsync<OperationCanceledException>(() => body.ReadAsync(new byte[1], stop.Token).AsTask());
                response.Dispose();
            }
            else
            {
                // The request body is still open (its writer waits for credit): the response's disposal alone
                // must reset the stream. Only once the server saw the abort is the writer let go.
                _stage = "cancelled by disposing the response";
                response.Dispose();
            }

            _stage += ", waiting for the server's RequestAborted";
            await server.AbortedAsync(path);
            await stop.CancelAsync();
        }
    }

    /// <summary>A request body of unknown length, written chunk by chunk as credits arrive, each chunk flushed.</summary>
    private sealed class DuplexContent(ulong seed, long length, SemaphoreSlim credits, CancellationToken stop) : HttpContent
    {
        protected override Task SerializeToStreamAsync(Stream stream, TransportContext? context) => SerializeToStreamAsync(stream, context, CancellationToken.None);

        protected override async Task SerializeToStreamAsync(Stream stream, TransportContext? context, CancellationToken cancellationToken)
        {
            using var linked = CancellationTokenSource.CreateLinkedTokenSource(stop, cancellationToken);
            var chunk = new byte[ChunkSize];
            for (long position = 0; position < length; position += ChunkSize)
            {
                await credits.WaitAsync(linked.Token);
                var size = (int)Math.Min(ChunkSize, length - position);
                TestData.Fill(seed, position, chunk.AsSpan(0, size));
                await stream.WriteAsync(chunk.AsMemory(0, size), linked.Token);
                await stream.FlushAsync(linked.Token);
            }
        }

        protected override bool TryComputeLength(out long length)
        {
            length = 0;
            return false;
        }
    }

    /// <summary>All streams wait here until every one of them has had its first echo back.</summary>
    private sealed class StartLine(int participants)
    {
        private readonly TaskCompletionSource _all = new(TaskCreationOptions.RunContinuationsAsynchronously);
        private int _arrived;

        public Task SignalAndWaitAsync()
        {
            if (Interlocked.Increment(ref _arrived) == participants)
            {
                _all.TrySetResult();
            }

            return _all.Task.WaitAsync(TestTimeouts.Default);
        }

        /// <summary>For a stream that ended or failed before its first echo: the others would wait for it in vain.</summary>
        public void Abandon(string path, string stage) =>
            _all.TrySetException(new StartLineAbandonedException($"{path} ended before its first echo came back (while {stage}), so not all streams could be open at once."));
    }

    private sealed class StartLineAbandonedException(string message) : Exception(message);

    /// <summary>How the server's echo of one stream ended: the bytes it handed to the response, its error, whether RequestAborted had fired.</summary>
    private sealed record StreamOutcome(long Echoed, Exception? Failure, bool Aborted);

    /// <summary>Echoes each request body as it reads it, flushing every piece, and records what happened per path.</summary>
    private sealed class EchoServer
    {
        private readonly ConcurrentDictionary<string, ServerStream> _streams = new();
        private int _active;
        private int _maxActive;

        public ConcurrentDictionary<string, byte> Connections { get; } = new();

        /// <summary>The most handlers that ran at once.</summary>
        public int MaxActive => Volatile.Read(ref _maxActive);

        public Task<StreamOutcome> OutcomeAsync(string path) => Stream(path).Outcome.Task.WaitAsync(TestTimeouts.Default);

        /// <summary>Completes once the stream's RequestAborted fired.</summary>
        public Task AbortedAsync(string path) => Stream(path).Aborted.Task.WaitAsync(TestTimeouts.Default);

        public string Describe(string path) => _streams.TryGetValue(path, out var stream)
            ? $"{stream.Stage}, {Volatile.Read(ref stream.Echoed)} echoed, RequestAborted {(stream.Aborted.Task.IsCompleted ? "fired" : "not fired")}"
            : "never saw it";

        public async Task HandleAsync(HttpContext context)
        {
            Connections.TryAdd(context.Connection.Id, 0);
            var path = context.Request.Path.Value!;
            var active = Interlocked.Increment(ref _active);
            for (var max = Volatile.Read(ref _maxActive); active > max && Interlocked.CompareExchange(ref _maxActive, active, max) != max; max = Volatile.Read(ref _maxActive))
            {
            }

            var stream = Stream(path);
            using var registration = context.RequestAborted.Register(() => stream.Aborted.TrySetResult());
            Exception? failure = null;
            try
            {
                if (context.Request.Protocol != "HTTP/2")
                {
                    throw new InvalidOperationException($"{path} arrived over {context.Request.Protocol}.");
                }

                // Not a divisor of the client's chunks, so the echo's pieces straddle them.
                var buffer = new byte[10_000];
                while (true)
                {
                    stream.Stage = "reading";
                    var n = await context.Request.Body.ReadAsync(buffer, context.RequestAborted);
                    if (n == 0)
                    {
                        break;
                    }

                    // Counted before the write, so the count is never behind what the client may have read.
                    Interlocked.Add(ref stream.Echoed, n);
                    stream.Stage = "writing";
                    await context.Response.Body.WriteAsync(buffer.AsMemory(0, n), context.RequestAborted);
                    stream.Stage = "flushing";
                    await context.Response.Body.FlushAsync(context.RequestAborted);
                }

                stream.Stage = "done";
            }
            catch (Exception ex)
            {
                stream.Stage = $"failed with {ex.GetType().Name}";
                failure = ex;

                // Kestrel fails the body at once but cancels RequestAborted from the thread pool: stay registered
                // until it fires (or the test gives up), or a handler that ends first would never see it.
                await Task.WhenAny(stream.Aborted.Task, Task.Delay(TestTimeouts.Default));
            }
            finally
            {
                Interlocked.Decrement(ref _active);
            }

            stream.Outcome.TrySetResult(new StreamOutcome(Volatile.Read(ref stream.Echoed), failure, context.RequestAborted.IsCancellationRequested));
        }

        private ServerStream Stream(string path) => _streams.GetOrAdd(path, static _ => new ServerStream());

        private sealed class ServerStream
        {
            public long Echoed;

            public volatile string Stage = "not started";

            public TaskCompletionSource<StreamOutcome> Outcome { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

            public TaskCompletionSource Aborted { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);
        }
    }
}
