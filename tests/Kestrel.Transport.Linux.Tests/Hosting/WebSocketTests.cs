using System.Net.Sockets;
using System.Net.WebSockets;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// Long-lived, full-duplex connections through Kestrel's upgrade path: WebSocket messages from 1 byte to 1 MiB
/// both ways at once, both close handshakes, and a client that vanishes in the middle of a message.
/// </summary>
public sealed class WebSocketTests(ITestOutputHelper output)
{
    private const int MiB = 1024 * 1024;
    private const ulong ClientSeed = 1000;
    private const ulong ServerSeed = 2000;

    /// <summary>How much of a never-finished message the server must have seen before the client vanishes.</summary>
    private const int MidMessage = 256 * 1024;

    // Every payload-length encoding on both sides of its boundary (7-bit up to 125, 16-bit up to 65535, 64-bit
    // beyond), 1 MiB, and a few sizes drawn with a fixed seed.
    private static readonly int[] s_sizes = [1, 2, 125, 126, 127, 65535, 65536, 65537, MiB, .. RandomSizes(seed: 7, count: 6)];

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Messages_from_1_byte_to_1_MiB_echo_intact_while_the_client_keeps_sending(TransportKind kind)
    {
        await using var host = await StartAsync(kind, static (_, _) => throw new InvalidOperationException("Only /echo is served."));
        using var ws = await ConnectAsync(host, "/echo");
        using var cts = new CancellationTokenSource(TestTimeouts.Default);

        // The client never waits for an echo before its next send: the server echoes each 16 KiB piece as it
        // arrives, so big messages travel both ways at once and neither side is request/response.
        var sending = Task.Run(async () =>
        {
            for (var i = 0; i < s_sizes.Length; i++)
            {
                await ws.SendAsync(TestData.Create(ClientSeed + (ulong)i, s_sizes[i]), WebSocketMessageType.Binary, endOfMessage: true, cts.Token);
            }
        });

        for (var i = 0; i < s_sizes.Length; i++)
        {
            var (type, data) = await ReceiveMessageAsync(ws, cts.Token);
            Assert.Equal(WebSocketMessageType.Binary, type);
            AssertSameBytes(TestData.Create(ClientSeed + (ulong)i, s_sizes[i]), data, $"the echo of message {i} ({s_sizes[i]} bytes)");
        }

        await sending.WaitAsync(TestTimeouts.Default);
        await ws.CloseAsync(WebSocketCloseStatus.NormalClosure, "done", cts.Token);
        Assert.Equal(WebSocketState.Closed, ws.State);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Client_and_server_messages_up_to_1_MiB_flow_both_ways_at_once(TransportKind kind)
    {
        // Both sides send all the sizes, the 1 MiB message first and the rest in opposite orders, and check what
        // they receive against the peer's seed; the server's verdict is the outcome of its own exchange.
        var clientOrder = s_sizes.OrderByDescending(static s => s == MiB).ThenBy(static s => s).ToArray();
        var serverOrder = s_sizes.OrderByDescending(static s => s == MiB).ThenByDescending(static s => s).ToArray();
        var exchanged = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var closed = new TaskCompletionSource<WebSocketReceiveResult>(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await StartAsync(kind, async (context, ws) =>
        {
            try
            {
                await ExchangeAsync(ws, ServerSeed, serverOrder, ClientSeed, clientOrder, context.RequestAborted);
                exchanged.TrySetResult();
                closed.TrySetResult(await EchoAsync(ws, context.RequestAborted));
            }
            catch (Exception ex)
            {
                exchanged.TrySetException(ex);
                closed.TrySetException(ex);
            }
        });

        using var ws = await ConnectAsync(host, "/duplex");
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        await FirstFailureAsync(ExchangeAsync(ws, ClientSeed, clientOrder, ServerSeed, serverOrder, cts.Token), exchanged.Task);

        await ws.CloseAsync(WebSocketCloseStatus.NormalClosure, "done", cts.Token);
        Assert.Equal(WebSocketState.Closed, ws.State);
        var close = await closed.Task.WaitAsync(TestTimeouts.Default);
        Assert.Equal(WebSocketCloseStatus.NormalClosure, close.CloseStatus);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task A_close_handshake_started_by_the_client_completes_on_both_sides(TransportKind kind)
    {
        var server = new TaskCompletionSource<(WebSocketReceiveResult Close, WebSocketState State)>(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await StartAsync(kind, async (context, ws) =>
        {
            try
            {
                var close = await EchoAsync(ws, context.RequestAborted);
                server.TrySetResult((close, ws.State));
            }
            catch (Exception ex)
            {
                server.TrySetException(ex);
            }
        });

        using var ws = await ConnectAsync(host, "/client-close");
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        await AssertEchoesAsync(ws, 100_000, cts.Token);

        await ws.CloseAsync(WebSocketCloseStatus.NormalClosure, "client is done", cts.Token);
        Assert.Equal(WebSocketState.Closed, ws.State);
        Assert.Equal(WebSocketCloseStatus.NormalClosure, ws.CloseStatus);
        Assert.Equal("client is done", ws.CloseStatusDescription);

        var (serverClose, serverState) = await server.Task.WaitAsync(TestTimeouts.Default);
        Assert.Equal(WebSocketMessageType.Close, serverClose.MessageType);
        Assert.Equal(WebSocketCloseStatus.NormalClosure, serverClose.CloseStatus);
        Assert.Equal("client is done", serverClose.CloseStatusDescription);
        Assert.Equal(WebSocketState.Closed, serverState);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task A_close_handshake_started_by_the_server_completes_on_both_sides(TransportKind kind)
    {
        const WebSocketCloseStatus ServerStatus = (WebSocketCloseStatus)4000; // An application's own code, so it cannot be a default.
        var server = new TaskCompletionSource<(WebSocketReceiveResult Close, WebSocketState State)>(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await StartAsync(kind, async (context, ws) =>
        {
            try
            {
                await ws.SendAsync(TestData.Create(ServerSeed, 100_000), WebSocketMessageType.Binary, endOfMessage: true, context.RequestAborted);
                await ws.CloseOutputAsync(ServerStatus, "server is done", context.RequestAborted);
                var close = await ws.ReceiveAsync(new ArraySegment<byte>(new byte[16]), context.RequestAborted);
                server.TrySetResult((close, ws.State));
            }
            catch (Exception ex)
            {
                server.TrySetException(ex);
            }
        });

        using var ws = await ConnectAsync(host, "/server-close");
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        var (type, data) = await ReceiveMessageAsync(ws, cts.Token);
        Assert.Equal(WebSocketMessageType.Binary, type);
        AssertSameBytes(TestData.Create(ServerSeed, 100_000), data, "the server's message");

        (type, _) = await ReceiveMessageAsync(ws, cts.Token);
        Assert.Equal(WebSocketMessageType.Close, type);
        Assert.Equal(WebSocketState.CloseReceived, ws.State);
        Assert.Equal(ServerStatus, ws.CloseStatus);
        Assert.Equal("server is done", ws.CloseStatusDescription);
        await ws.CloseOutputAsync(ServerStatus, "client agrees", cts.Token);
        Assert.Equal(WebSocketState.Closed, ws.State);

        var (serverClose, serverState) = await server.Task.WaitAsync(TestTimeouts.Default);
        Assert.Equal(WebSocketMessageType.Close, serverClose.MessageType);
        Assert.Equal(ServerStatus, serverClose.CloseStatus);
        Assert.Equal("client agrees", serverClose.CloseStatusDescription);
        Assert.Equal(WebSocketState.Closed, serverState);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task A_client_that_aborts_mid_message_ends_the_server_receive_and_the_host_keeps_serving(TransportKind kind)
    {
        const int Sent = 768 * 1024;
        var midMessage = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var server = new TaskCompletionSource<HoldOutcome>(TaskCreationOptions.RunContinuationsAsynchronously);

        // No cancellation token on the server's receive: only the transport noticing the lost client can end it.
        await using var host = await StartAsync(kind, async (_, ws) => server.TrySetResult(await HoldAsync(ws, midMessage, CancellationToken.None)));

        using (var ws = await ConnectAsync(host, "/hold"))
        {
            using var cts = new CancellationTokenSource(TestTimeouts.Default);

            // Three quarters of a 1 MiB message, in fragments, and never its end.
            var message = TestData.Create(ClientSeed, MiB);
            for (var offset = 0; offset < Sent; offset += 64 * 1024)
            {
                await ws.SendAsync(message.AsMemory(offset, 64 * 1024), WebSocketMessageType.Binary, endOfMessage: false, cts.Token);
            }

            await midMessage.Task.WaitAsync(TestTimeouts.Default);
            ws.Abort();
        }

        var outcome = await server.Task.WaitAsync(TestTimeouts.Default);
        Assert.Null(outcome.Problem);
        output.WriteLine($"The server's receive ended with {outcome.Exception?.GetType().Name}: {outcome.Exception?.Message}");

        // The client closed its socket with nothing unread, so a FIN followed everything it had sent: every byte
        // arrives, then the frame is cut short.
        var exception = Assert.IsType<WebSocketException>(outcome.Exception);
        Assert.Equal(WebSocketError.ConnectionClosedPrematurely, exception.WebSocketErrorCode);
        Assert.Equal(Sent, outcome.Received);
        Assert.Equal(WebSocketState.Aborted, outcome.State);

        await AssertServesNewConnectionAsync(host);
        await host.StopAsync();
    }

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task A_client_reset_mid_message_ends_the_server_receive_and_its_blocked_send_and_the_host_keeps_serving(TransportKind kind)
    {
        var midMessage = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var requestAborted = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var serverReceive = new TaskCompletionSource<HoldOutcome>(TaskCreationOptions.RunContinuationsAsynchronously);
        var serverSend = new TaskCompletionSource<Exception>(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await StartAsync(kind, async (context, ws) =>
        {
            using var registration = context.RequestAborted.Register(() => requestAborted.TrySetResult());

            // An endless message to a client that soon stops reading: the send is blocked on backpressure when
            // the reset arrives, and only the connection's abort can end it.
            var sending = Task.Run(async () =>
            {
                try
                {
                    var chunk = new byte[64 * 1024];
                    for (long position = 0; ; position += chunk.Length)
                    {
                        TestData.Fill(ServerSeed, position, chunk);
                        await ws.SendAsync(chunk, WebSocketMessageType.Binary, endOfMessage: false, context.RequestAborted);
                    }
                }
                catch (Exception ex)
                {
                    serverSend.TrySetResult(ex);
                }
            });

            serverReceive.TrySetResult(await HoldAsync(ws, midMessage, CancellationToken.None));
            await sending;

            // Kestrel cancels RequestAborted from the thread pool, possibly after both loops ended: stay registered
            // until it fires (or the test gives up), or a handler that ends first would never see it.
            await Task.WhenAny(requestAborted.Task, Task.Delay(TestTimeouts.Default));
        });

        Socket? socket = null;
        using var handler = new SocketsHttpHandler
        {
            UseProxy = false,
            ConnectCallback = async (context, cancellationToken) =>
            {
                var s = new Socket(SocketType.Stream, ProtocolType.Tcp) { NoDelay = true };
                try
                {
                    await s.ConnectAsync(context.DnsEndPoint, cancellationToken);
                }
                catch
                {
                    s.Dispose();
                    throw;
                }

                socket = s;
                return new NetworkStream(s, ownsSocket: true);
            },
        };
        using var invoker = new HttpMessageInvoker(handler);

        using (var ws = await ConnectAsync(host, "/hold", invoker))
        {
            using var cts = new CancellationTokenSource(TestTimeouts.Default);

            // Some of the server's endless message, checked, while half a 1 MiB message goes the other way.
            var message = TestData.Create(ClientSeed, MiB);
            var sending = Task.Run(async () =>
            {
                for (var offset = 0; offset < MiB / 2; offset += 64 * 1024)
                {
                    await ws.SendAsync(message.AsMemory(offset, 64 * 1024), WebSocketMessageType.Binary, endOfMessage: false, cts.Token);
                }
            });

            var buffer = new byte[64 * 1024];
            var expected = new byte[buffer.Length];
            long received = 0;
            while (received < MiB / 2)
            {
                var result = await ws.ReceiveAsync(buffer.AsMemory(), cts.Token);
                Assert.Equal(WebSocketMessageType.Binary, result.MessageType);
                Assert.False(result.EndOfMessage, "The server's endless message ended.");
                TestData.Fill(ServerSeed, received, expected.AsSpan(0, result.Count));
                AssertSameBytes(expected.AsSpan(0, result.Count), buffer.AsSpan(0, result.Count), $"the server's message at {received}");
                received += result.Count;
            }

            await sending.WaitAsync(TestTimeouts.Default);
            await midMessage.Task.WaitAsync(TestTimeouts.Default);

            // SO_LINGER 0: close sends an RST, whatever is unread.
            Assert.NotNull(socket);
            socket.LingerState = new LingerOption(enable: true, seconds: 0);
            socket.Dispose();
            ws.Abort();
        }

        // All three must happen; on a timeout, say which did not.
        var ended = Task.WhenAll(requestAborted.Task, serverReceive.Task, serverSend.Task);
        if (await Task.WhenAny(ended, Task.Delay(TestTimeouts.Default)) != ended)
        {
            Assert.Fail($"{TestTimeouts.Default} after the reset: RequestAborted fired: {requestAborted.Task.IsCompleted}, the server's receive ended: {serverReceive.Task.IsCompleted}, its send ended: {serverSend.Task.IsCompleted}.");
        }

        var receive = await serverReceive.Task;
        var send = await serverSend.Task;
        Assert.Null(receive.Problem);
        output.WriteLine($"The server's receive ended with {receive.Exception?.GetType().Name}: {receive.Exception?.Message}");
        output.WriteLine($"The server's send ended with {send.GetType().Name}: {send.Message}");

        // The receive sees either the reset itself or the abort the failed send caused first; never a message.
        Assert.True(receive.Exception is WebSocketException or OperationCanceledException, $"Unexpected receive outcome: {receive.Exception}");
        Assert.True(send is WebSocketException or OperationCanceledException, $"Unexpected send outcome: {send}");
        Assert.True(receive.Received >= MidMessage, $"The server saw only {receive.Received} bytes.");
        Assert.True(receive.Received <= MiB / 2, $"The server saw {receive.Received} bytes of a message only {MiB / 2} long.");
        Assert.Equal(WebSocketState.Aborted, receive.State);

        await AssertServesNewConnectionAsync(host);
        await host.StopAsync();
    }

    private Task<TestHost> StartAsync(TransportKind kind, Func<HttpContext, WebSocket, Task> app) => TestHost.StartAsync(
        kind,
        output,
        async context =>
        {
            if (!context.WebSockets.IsWebSocketRequest)
            {
                context.Response.StatusCode = StatusCodes.Status400BadRequest;
                return;
            }

            using var ws = await context.WebSockets.AcceptWebSocketAsync();
            if (context.Request.Path == "/echo")
            {
                await EchoAsync(ws, context.RequestAborted);
            }
            else
            {
                await app(context, ws);
            }
        },
        s => s.Middleware = app => app.UseWebSockets());

    private static async Task<ClientWebSocket> ConnectAsync(TestHost host, string path, HttpMessageInvoker? invoker = null)
    {
        var ws = new ClientWebSocket();
        var uri = new UriBuilder(host.Address) { Scheme = "ws", Path = path }.Uri;
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        try
        {
            await (invoker is null ? ws.ConnectAsync(uri, cts.Token) : ws.ConnectAsync(uri, invoker, cts.Token));
        }
        catch
        {
            ws.Dispose();
            throw;
        }

        return ws;
    }

    /// <summary>Echoes every piece as it arrives, in 16 KiB pieces, and answers the peer's close with its own status.</summary>
    private static async Task<WebSocketReceiveResult> EchoAsync(WebSocket ws, CancellationToken cancellationToken)
    {
        var buffer = new byte[16 * 1024];
        while (true)
        {
            var result = await ws.ReceiveAsync(new ArraySegment<byte>(buffer), cancellationToken);
            if (result.MessageType == WebSocketMessageType.Close)
            {
                await ws.CloseAsync(result.CloseStatus!.Value, result.CloseStatusDescription, cancellationToken);
                return result;
            }

            await ws.SendAsync(new ArraySegment<byte>(buffer, 0, result.Count), result.MessageType, result.EndOfMessage, cancellationToken);
        }
    }

    /// <summary>
    /// Sends one side's messages while it receives and checks the other's. The first message of each side is
    /// sent in two halves, the second only once half of the peer's first message has arrived, so that both
    /// directions are in the middle of a large frame at the same time.
    /// </summary>
    private static async Task ExchangeAsync(WebSocket ws, ulong sendSeed, int[] sendSizes, ulong receiveSeed, int[] receiveSizes, CancellationToken cancellationToken)
    {
        var peerHalfway = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        await FirstFailureAsync(Task.Run(SendAllAsync, cancellationToken), Task.Run(ReceiveAllAsync, cancellationToken));

        async Task SendAllAsync()
        {
            for (var i = 0; i < sendSizes.Length; i++)
            {
                var message = TestData.Create(sendSeed + (ulong)i, sendSizes[i]);
                if (i == 0)
                {
                    var half = message.Length / 2;
                    await ws.SendAsync(message.AsMemory(0, half), WebSocketMessageType.Binary, endOfMessage: false, cancellationToken);
                    await peerHalfway.Task.WaitAsync(cancellationToken);
                    await ws.SendAsync(message.AsMemory(half), WebSocketMessageType.Binary, endOfMessage: true, cancellationToken);
                }
                else
                {
                    await ws.SendAsync(message, WebSocketMessageType.Binary, endOfMessage: true, cancellationToken);
                }
            }
        }

        async Task ReceiveAllAsync()
        {
            for (var i = 0; i < receiveSizes.Length; i++)
            {
                var size = receiveSizes[i];
                var (type, data) = await ReceiveMessageAsync(ws, cancellationToken, i == 0 ? received =>
                {
                    if (received >= size / 2)
                    {
                        peerHalfway.TrySetResult();
                    }
                }
                : null);
                Assert.Equal(WebSocketMessageType.Binary, type);
                AssertSameBytes(TestData.Create(receiveSeed + (ulong)i, size), data, $"message {i} ({size} bytes)");
            }
        }
    }

    /// <summary>
    /// What the server saw of a message that never ended: how the receive failed, or <paramref name="Problem"/>
    /// when it did not fail but saw something other than the next bytes of the client's message.
    /// </summary>
    private sealed record HoldOutcome(Exception? Exception, string? Problem, long Received, WebSocketState State);

    /// <summary>Receives and checks the client's never-ending message until the receive fails.</summary>
    private static async Task<HoldOutcome> HoldAsync(WebSocket ws, TaskCompletionSource midMessage, CancellationToken cancellationToken)
    {
        var buffer = new byte[64 * 1024];
        var expected = new byte[buffer.Length];
        long received = 0;
        while (true)
        {
            ValueWebSocketReceiveResult result;
            try
            {
                result = await ws.ReceiveAsync(buffer.AsMemory(), cancellationToken);
            }
            catch (Exception ex)
            {
                return new HoldOutcome(ex, null, received, ws.State);
            }

            if (result.MessageType != WebSocketMessageType.Binary || result.EndOfMessage)
            {
                return new HoldOutcome(null, $"Expected more of a binary message, got {result.MessageType} (end: {result.EndOfMessage}) after {received} bytes.", received, ws.State);
            }

            TestData.Fill(ClientSeed, received, expected.AsSpan(0, result.Count));
            if (!expected.AsSpan(0, result.Count).SequenceEqual(buffer.AsSpan(0, result.Count)))
            {
                return new HoldOutcome(null, $"The client's message differs within the {result.Count} bytes at {received}.", received, ws.State);
            }

            received += result.Count;
            if (received >= MidMessage)
            {
                midMessage.TrySetResult();
            }
        }
    }

    private static async Task<(WebSocketMessageType Type, byte[] Data)> ReceiveMessageAsync(WebSocket ws, CancellationToken cancellationToken, Action<long>? progress = null)
    {
        using var message = new MemoryStream();
        var buffer = new byte[64 * 1024];
        while (true)
        {
            var result = await ws.ReceiveAsync(buffer.AsMemory(), cancellationToken);
            message.Write(buffer, 0, result.Count);
            progress?.Invoke(message.Length);
            if (result.EndOfMessage)
            {
                return (result.MessageType, message.ToArray());
            }
        }
    }

    private static async Task AssertEchoesAsync(WebSocket ws, int size, CancellationToken cancellationToken)
    {
        var message = TestData.Create(ClientSeed + (ulong)size, size);
        var receiving = ReceiveMessageAsync(ws, cancellationToken);
        await ws.SendAsync(message, WebSocketMessageType.Binary, endOfMessage: true, cancellationToken);
        var (type, data) = await receiving;
        Assert.Equal(WebSocketMessageType.Binary, type);
        AssertSameBytes(message, data, $"the echo of {size} bytes");
    }

    /// <summary>A new WebSocket on the same host: messages echo intact and it closes cleanly.</summary>
    private static async Task AssertServesNewConnectionAsync(TestHost host)
    {
        using var ws = await ConnectAsync(host, "/echo");
        using var cts = new CancellationTokenSource(TestTimeouts.Default);
        foreach (var size in new[] { 1, 65536, MiB })
        {
            await AssertEchoesAsync(ws, size, cts.Token);
        }

        await ws.CloseAsync(WebSocketCloseStatus.NormalClosure, "done", cts.Token);
        Assert.Equal(WebSocketState.Closed, ws.State);
    }

    private static void AssertSameBytes(ReadOnlySpan<byte> expected, ReadOnlySpan<byte> actual, string what)
    {
        Assert.True(expected.Length == actual.Length, $"{what}: {actual.Length} bytes arrived, {expected.Length} were sent.");
        var mismatch = expected.CommonPrefixLength(actual);
        Assert.True(mismatch == expected.Length, $"{what}: the bytes differ from offset {mismatch} on.");
    }

    /// <summary>Awaits both, but reports whichever fails first, so that one side's error is not hidden behind the other's timeout.</summary>
    private static async Task FirstFailureAsync(Task first, Task second)
    {
        var done = await Task.WhenAny(first, second).WaitAsync(TestTimeouts.Default);
        await done;
        await (done == first ? second : first).WaitAsync(TestTimeouts.Default);
    }

    private static int[] RandomSizes(int seed, int count)
    {
        var random = new Random(seed);
        return Enumerable.Range(0, count).Select(_ => random.Next(3, 300_000)).ToArray();
    }
}
