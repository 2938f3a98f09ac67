using System.Diagnostics;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Load;

/// <summary>The largest batch one loop can meet: thousands of connections of one loop ready in the same pass.</summary>
[Collection(QuietProcess.Name)]
public sealed class LargestBatchTests(ITestOutputHelper output)
{
    private const int Connections = 4_000;
    private const int BodyLength = 64 * 1024;

    // Client and server sockets are both in this process here.
    private const int DescriptorsNeeded = (2 * Connections) + 1_000;

    // EpollEngine.EventCapacity: one epoll_wait reports at most this many sockets.
    private const int EventsPerWait = 256;

    /// <summary>
    /// Every Linux kind runs with Inline scheduling here, because only then can the app hold the loop thread
    /// still while the batch builds up; the kinds differ by engine: native readv/sendmsg, managed, AIO io_submit.
    /// </summary>
    public static TheoryData<TransportKind> Kinds =>
        new() { TransportKind.Sockets, TransportKind.LinuxInline, TransportKind.LinuxManaged, TransportKind.LinuxAio, TransportKind.LinuxIoUring };

    /// <summary>
    /// Proves that one loop (ThreadCount = 1) serves 4,000 connections correctly when all of them become ready
    /// at once: while one request blocks the loop thread, 4,000 responses are flushed and 4,000 requests with
    /// 64 KiB bodies arrive, so the next pass sends to all 4,000 in one batch and the following passes receive
    /// from thousands in one batch, far past any array sized for a common case. The transport's meter shows
    /// the batch sizes it reached.
    /// </summary>
    [FileDescriptorTheory(DescriptorsNeeded)]
    [MemberData(nameof(Kinds))]
    public async Task Four_thousand_connections_ready_in_the_same_pass_of_one_loop_are_all_served(TransportKind kind)
    {
        FileDescriptorLimit.RaiseSoftTo(DescriptorsNeeded);
        using var meter = new TransportMeter();
        var waiting = 0;
        var responded = 0;
        var allWaiting = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var allResponded = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var gate = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var blockerEntered = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        using var loopReleased = new ManualResetEventSlim();
        string? blockedThread = null;

        await using var host = await TestHost.StartAsync(
            kind,
            output,
            async context =>
            {
                var parts = context.Request.Path.Value!.Split('/');
                string body;
                switch (parts[1])
                {
                    case "block":
                        // In Inline mode this runs on the loop thread: blocking it stops the loop between passes.
                        blockedThread = Thread.CurrentThread.Name;
                        blockerEntered.TrySetResult();
                        Assert.True(loopReleased.Wait(TestTimeouts.Large));
                        body = "unblocked";
                        break;
                    case "held":
                        if (Interlocked.Increment(ref waiting) == Connections)
                        {
                            allWaiting.TrySetResult();
                        }

                        await gate.Task;
                        body = "held " + parts[2];
                        break;
                    case "body":
                        var length = 0L;
                        var buffer = new byte[16 * 1024];
                        int n;
                        while ((n = await context.Request.Body.ReadAsync(buffer)) > 0)
                        {
                            Assert.True(buffer.AsSpan(0, n).IndexOfAnyExcept((byte)'b') < 0, "The body carried bytes the client never sent.");
                            length += n;
                        }

                        body = $"body {parts[2]} {length}";
                        break;
                    default:
                        body = "warm " + parts[2];
                        break;
                }

                context.Response.ContentLength = body.Length;
                await context.Response.WriteAsync(body);
                if (parts[1] == "held" && Interlocked.Increment(ref responded) == Connections)
                {
                    allResponded.TrySetResult();
                }
            },
            s => s.Linux = o =>
            {
                o.ThreadCount = 1;
                o.ApplicationSchedulingMode = ApplicationSchedulingMode.Inline;
            });

        var clients = new List<RawHttpConnection>(Connections);
        try
        {
            for (var i = 0; i < Connections; i++)
            {
                clients.Add(await LeanConnection.ConnectAsync(host.EndPoint));
            }

            using var blocker = await LeanConnection.ConnectAsync(host.EndPoint);

            // Every connection served once, so the server has accepted and set up all of them.
            await Task.WhenAll(clients.Select((c, i) => c.SendAsync(RawHttpRequest.Bytes("GET", $"/warm/{i}"), TestTimeouts.Large)));
            await AssertResponsesAsync(clients, i => $"warm {i}");

            await Task.WhenAll(clients.Select((c, i) => c.SendAsync(RawHttpRequest.Bytes("GET", $"/held/{i}"), TestTimeouts.Large)));
            await allWaiting.Task.WaitAsync(TestTimeouts.Large);

            await blocker.SendAsync(RawHttpRequest.Bytes("GET", "/block"), TestTimeouts.Large);
            await blockerEntered.Task.WaitAsync(TestTimeouts.Default);
            if (kind.IsLinux())
            {
                Assert.Equal("Kestrel Linux loop 0", blockedThread);
            }

            // While the loop is held: 4,000 responses are flushed from thread-pool threads (each schedules
            // its send on the loop) and 4,000 request bodies arrive.
            var stopwatch = Stopwatch.StartNew();
            gate.SetResult();
            await allResponded.Task.WaitAsync(TestTimeouts.Large);
            var bodies = new byte[BodyLength];
            bodies.AsSpan().Fill((byte)'b');
            var sends = Task.WhenAll(clients.Select((c, i) => SendWithBodyAsync(c, i, bodies)));
            await Task.WhenAny(sends, Task.Delay(TimeSpan.FromSeconds(5)));
            output.WriteLine($"Bodies sent while the loop was held: {sends.IsCompleted} after {stopwatch.Elapsed.TotalSeconds:F1} s.");

            loopReleased.Set();
            await AssertResponsesAsync(clients, i => $"held {i}");
            Assert.Equal((200, "unblocked"), await blocker.ReadStatusAndBodyAsync(TestTimeouts.Default));
            await sends.WaitAsync(TestTimeouts.Large);
            await AssertResponsesAsync(clients, i => $"body {i} {BodyLength}");
            output.WriteLine($"Released to all served: {stopwatch.Elapsed.TotalSeconds:F1} s.");

            if (kind.IsLinux())
            {
                var largestSend = meter.Max("kestrel.transport.linux.send.queue_length");
                var largestReceiveBytes = meter.Max("kestrel.transport.linux.pass.bytes", "receive");
                Figures.Report(output, "Largest batch on one loop", kind, $"{largestSend} connections in one send batch; {largestReceiveBytes} bytes in one receive batch (at most {DiagnosticMemoryPoolFactory.BlockSize} per connection, so at least {largestReceiveBytes / DiagnosticMemoryPoolFactory.BlockSize} connections)");
                Assert.True(largestSend >= Connections, $"The responses flushed while the loop was held should have gone out in one send batch of {Connections}; the largest was {largestSend}.");
                Assert.True(
                    largestReceiveBytes > EventsPerWait * DiagnosticMemoryPoolFactory.BlockSize,
                    $"A receive batch should have held more connections than one epoll_wait reports ({EventsPerWait}); the largest moved {largestReceiveBytes} bytes, at most {DiagnosticMemoryPoolFactory.BlockSize} per connection.");
            }
        }
        finally
        {
            loopReleased.Set();
            gate.TrySetResult();
            clients.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    private static async Task SendWithBodyAsync(RawHttpConnection client, int index, byte[] body)
    {
        await client.SendAsync(RawHttpRequest.Bytes("POST", $"/body/{index}", $"Content-Length: {body.Length}\r\n"), TestTimeouts.Large);
        await client.SendAsync(body, TestTimeouts.Large);
    }

    private static async Task AssertResponsesAsync(List<RawHttpConnection> clients, Func<int, string> expected)
    {
        var responses = await Task.WhenAll(clients.Select(c => c.ReadStatusAndBodyAsync(TestTimeouts.Large)));
        for (var i = 0; i < responses.Length; i++)
        {
            Assert.Equal((200, expected(i)), responses[i]);
        }
    }
}
