using System.Diagnostics;
using System.Globalization;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;

namespace Kestrel.Transport.Linux.Reliability.Tests.Faults;

/// <summary>Graceful shutdown under load: it drains what it can, and aborts racing it break nothing.</summary>
public sealed class ShutdownFaultTests(ITestOutputHelper output)
{
    private const ulong Seed = 11;

    public static TheoryData<TransportKind> Kinds => ReliabilityTransports.Scheduling;

    /// <summary>
    /// Proves that when StopAsync (shutdown timeout 2 s) starts while 100 responses are streaming, and at the
    /// same moment a quarter of the clients reset and a quarter of the requests call HttpContext.Abort(), no
    /// exception escapes (none unobserved), nothing logs an error or an ObjectDisposedException, StopAsync
    /// completes within its timeout plus Kestrel's 1 s abort grace and a margin, and every pool block comes back.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Aborts_racing_graceful_shutdown_break_nothing(TransportKind kind)
    {
        const int Connections = 100;
        var shutdownTimeout = TimeSpan.FromSeconds(2);
        using var unobserved = new UnobservedExceptions();
        var logs = new LogRecorder();
        var started = 0;
        var allStarted = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var stopping = new CancellationTokenSource();
        await using var host = await TestHost.StartAsync(
            kind,
            output,
            async context =>
            {
                var index = int.Parse(context.Request.Path.Value!.Split('/')[2], CultureInfo.InvariantCulture);
                if (Interlocked.Increment(ref started) == Connections)
                {
                    allStarted.TrySetResult();
                }

                var chunk = TestData.Create(Seed, 16 * 1024);
                try
                {
                    while (true)
                    {
                        await context.Response.Body.WriteAsync(chunk, context.RequestAborted);
                        if (index % 4 == 1 && stopping.IsCancellationRequested)
                        {
                            context.Abort();
                            return;
                        }

                        await Task.Delay(5, context.RequestAborted);
                    }
                }
                catch (Exception e) when (e is OperationCanceledException or IOException)
                {
                    // The client reset, or the server aborted the request at the end of the shutdown timeout.
                }
            },
            s => s.Builder = builder =>
            {
                logs.AddTo(builder);
                builder.Services.Configure<HostOptions>(o => o.ShutdownTimeout = shutdownTimeout);
            });

        var clients = new List<Socket>();
        for (var i = 0; i < Connections; i++)
        {
            var client = await TestSockets.ConnectAsync(host.EndPoint);
            clients.Add(client);
            await client.SendAllAsync(RawHttpRequest.Bytes("GET", $"/stream/{i}"));
        }

        var readers = clients.Select(DrainUntilClosedAsync).ToArray();
        await allStarted.Task.WaitAsync(TestTimeouts.Default);

        var stopwatch = Stopwatch.StartNew();
        var stop = host.BeginStop();
        await stopping.CancelAsync();
        for (var i = 0; i < Connections; i += 4)
        {
            clients[i].LingerState = new LingerOption(true, 0);
            clients[i].Dispose();
        }

        await stop.WaitAsync(shutdownTimeout + TimeSpan.FromSeconds(1) + TimeSpan.FromSeconds(10));
        output.WriteLine($"StopAsync completed {stopwatch.Elapsed.TotalSeconds:F1} s after it began (shutdown timeout {shutdownTimeout.TotalSeconds} s).");
        await host.StopAsync();

        var endings = await Task.WhenAll(readers).WaitAsync(TestTimeouts.Default);
        output.WriteLine(string.Join(", ", endings.GroupBy(e => e).Select(g => $"{g.Count()} {g.Key}")));
        clients.ForEach(c => c.Dispose());

        logs.AssertNone("Aborts racing graceful shutdown");
        unobserved.AssertNone("Aborts racing graceful shutdown");
    }

    /// <summary>
    /// Proves that responses in flight when StopAsync is called (shutdown timeout 20 s) all complete in full
    /// (4 MiB each, SHA-256 checked), that new connections are refused from the start of the shutdown, and
    /// that StopAsync completes as soon as they are done, well inside its timeout.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task Shutdown_drains_responses_in_flight_within_its_timeout_and_refuses_new_connections(TransportKind kind)
    {
        const int Connections = 32;
        const long ResponseLength = 4 * ProcessMemory.MiB;
        var shutdownTimeout = TimeSpan.FromSeconds(20);
        var started = 0;
        var allStarted = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var release = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await TestHost.StartAsync(
            kind,
            output,
            async context =>
            {
                if (Interlocked.Increment(ref started) == Connections)
                {
                    allStarted.TrySetResult();
                }

                await release.Task;
                await GeneratedBody.WriteResponseAsync(context, Seed, ResponseLength);
            },
            s => s.Builder = builder => builder.Services.Configure<HostOptions>(o => o.ShutdownTimeout = shutdownTimeout));

        var clients = new List<Socket>();
        for (var i = 0; i < Connections; i++)
        {
            var client = await TestSockets.ConnectAsync(host.EndPoint);
            clients.Add(client);
            await client.SendAllAsync(RawHttpRequest.Bytes("GET", $"/drain/{i}"));
        }

        await allStarted.Task.WaitAsync(TestTimeouts.Default);
        var stopwatch = Stopwatch.StartNew();
        var stop = host.BeginStop();
        var deadline = Stopwatch.StartNew();
        while (!await TestSockets.IsRefusedAsync(host.EndPoint))
        {
            Assert.True(deadline.Elapsed < TestTimeouts.Default, "The server still accepted connections long after StopAsync began.");
            await Task.Delay(20);
        }

        Assert.False(stop.IsCompleted, "StopAsync finished while responses were still in flight.");
        release.SetResult();
        var expected = (200, ResponseLength, TestData.Sha256(Seed, ResponseLength));
        var responses = await Task.WhenAll(clients.Select(c => GeneratedBody.ReadResponseHashedAsync(c, TestTimeouts.Large)));
        Assert.All(responses, r => Assert.Equal(expected, r));

        await stop.WaitAsync(shutdownTimeout / 2);
        output.WriteLine($"StopAsync completed {stopwatch.Elapsed.TotalSeconds:F1} s after it began (timeout {shutdownTimeout.TotalSeconds} s).");
        Assert.True(await TestSockets.IsRefusedAsync(host.EndPoint), "A connection was accepted after the shutdown.");
        clients.ForEach(c => c.Dispose());
        await host.StopAsync();
    }

    /// <summary>Reads until the server ends the connection; returns how it ended. Never throws, so nothing goes unobserved.</summary>
    private static async Task<string> DrainUntilClosedAsync(Socket socket)
    {
        var buffer = new byte[64 * 1024];
        try
        {
            while (await socket.ReceiveAsync(buffer, SocketFlags.None) > 0)
            {
            }

            return "FIN";
        }
        catch (SocketException e)
        {
            return e.SocketErrorCode.ToString();
        }
        catch (ObjectDisposedException)
        {
            return "reset by the client";
        }
    }
}
