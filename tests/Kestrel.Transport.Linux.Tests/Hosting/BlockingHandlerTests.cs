using System.Collections.Concurrent;
using System.Diagnostics;
using System.Net;
using System.Net.Sockets;
using System.Text;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// An app that blocks a thread must not stall the other connections of its loop. Every server here has one
/// loop, so all connections share it. Each expectation is a functional fact with a wide margin, never a timing
/// bound: while a handler blocks, bystanders finish every request before it returns. The test, not a clock, ends the
/// block once the bystanders are done (or after 30 s), so a test thread the machine schedules late cannot start them
/// after the block has run out. Sockets and
/// ThreadPool scheduling meet them by running the app on pool threads; Adaptive scheduling runs it on the loop
/// and must move the loop to another thread when it blocks, which the Adaptive case checks happened. Inline
/// kinds are left out: never blocking is their contract. In the quiet collection: one case counts the process's loop
/// threads, and with Adaptive the default, tests running beside it start loop threads of their own (22 were seen).
/// </summary>
[Collection(QuietProcess.Name)]
public sealed class BlockingHandlerTests(ITestOutputHelper output)
{
    private static readonly TimeSpan MostBlock = TestTimeouts.Default;
    private const int Bystanders = 8;
    private const int RequestsPerBystander = 5;

    public enum Blocking
    {
        Sleep,
        TaskResult,
        ContendedLock,
    }

    public static TheoryData<TransportKind, Blocking> KindsAndWaysToBlock()
    {
        var data = new TheoryData<TransportKind, Blocking>();
        foreach (var row in (IEnumerable<object[]>)Transports.AllowBlocking)
        {
            foreach (var how in Enum.GetValues<Blocking>())
            {
                data.Add((TransportKind)row[0], how);
            }
        }

        return data;
    }

    [Theory]
    [MemberData(nameof(KindsAndWaysToBlock))]
    public async Task Bystanders_on_the_same_loop_are_answered_while_a_handler_blocks(TransportKind kind, Blocking how)
    {
        var blocking = new TaskCompletionSource<string?>(TaskCreationOptions.RunContinuationsAsynchronously);
        var release = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        long returnedAt = 0;
        object contended = new();

        await using var host = await StartAsync(kind, async context =>
        {
            if (context.Request.Path == "/block")
            {
                blocking.TrySetResult(Thread.CurrentThread.Name);
                Block(how, contended, release.Task);
                Volatile.Write(ref returnedAt, Stopwatch.GetTimestamp());
            }

            await context.Response.WriteAsync("ok");
        });

        // The blocking request is the second of its connection, so that the transport, not Kestrel's accept path,
        // schedules it.
        using var blocker = new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large };
        Assert.Equal("ok", await blocker.GetStringAsync("/first"));
        var clients = Enumerable.Range(0, Bystanders).Select(_ => new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large }).ToList();
        try
        {
            foreach (var client in clients)
            {
                Assert.Equal("ok", await client.GetStringAsync("/first"));
            }

            Thread? lockHolder = how == Blocking.ContendedLock ? HoldLock(contended, release.Task) : null;
            var blocked = blocker.GetStringAsync("/block");
            string? blockedThread = await blocking.Task.WaitAsync(TestTimeouts.Default);
            output.WriteLine($"{kind}: the handler blocks on thread '{blockedThread}'");

            var answered = new ConcurrentBag<(long At, TimeSpan Took)>();
            await Task.WhenAll(clients.Select(async client =>
            {
                for (int i = 0; i < RequestsPerBystander; i++)
                {
                    var started = Stopwatch.GetTimestamp();
                    Assert.Equal("ok", await client.GetStringAsync("/bystander"));
                    answered.Add((Stopwatch.GetTimestamp(), Stopwatch.GetElapsedTime(started)));
                }
            })).WaitAsync(TestTimeouts.Large);

            release.TrySetResult();
            Assert.Equal("ok", await blocked.WaitAsync(TestTimeouts.Large));
            lockHolder?.Join();
            long returned = Volatile.Read(ref returnedAt);
            output.WriteLine($"{kind}, {how}: slowest bystander request {answered.Max(a => a.Took).TotalMilliseconds:F0} ms");
            Assert.Equal(Bystanders * RequestsPerBystander, answered.Count);
            Assert.All(answered, a => Assert.True(a.At < returned, $"a bystander was answered only after the blocked handler returned (slowest took {answered.Max(x => x.Took).TotalMilliseconds:F0} ms)"));

            if (kind.RunsContinuationsOnLoop())
            {
                // Otherwise the handler ran on a pool thread, and this case proved nothing about moving a loop: it
                // blocked the loop's own thread, so the bystanders were answered by the thread the loop moved to.
                Assert.Equal("Kestrel Linux loop 0", blockedThread);
            }
        }
        finally
        {
            release.TrySetResult();
            clients.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>
    /// A synchronous read of a body that arrives in pieces, 100 ms apart, waits for data that only the loop can
    /// receive: the loop must not be the thread that waits.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.AllowBlocking), MemberType = typeof(Transports))]
    public async Task A_synchronous_read_of_a_slow_body_completes(TransportKind kind)
    {
        const int Pieces = 6;
        const int PieceLength = 1000;
        await using var host = await StartAsync(kind, async context =>
        {
            var buffer = new byte[4096];
            long total = 0;
            int read;
            while ((read = context.Request.Body.Read(buffer)) > 0)
            {
                total += read;
            }

            await context.Response.WriteAsync($"received {total} on '{Thread.CurrentThread.Name}'");
        });

        using var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
        await socket.ConnectAsync(host.EndPoint);
        await using var stream = new NetworkStream(socket, ownsSocket: false);

        // A first request on the connection, so that the second is scheduled by the transport.
        await stream.WriteAsync(Encoding.ASCII.GetBytes("POST /warm HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"));
        Assert.Contains("received 1", await ReadResponseAsync(stream));

        await stream.WriteAsync(Encoding.ASCII.GetBytes($"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: {Pieces * PieceLength}\r\n\r\n"));
        for (int i = 0; i < Pieces; i++)
        {
            await Task.Delay(100);
            await stream.WriteAsync(new byte[PieceLength]);
        }

        string response = await ReadResponseAsync(stream).WaitAsync(TestTimeouts.Large);
        output.WriteLine(response);
        Assert.Contains($"received {Pieces * PieceLength}", response);
        await host.StopAsync();
    }

    /// <summary>
    /// A handler that blocks until another connection of the same loop delivers data: a deadlock if the loop
    /// waited with it, as with Inline scheduling.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.AllowBlocking), MemberType = typeof(Transports))]
    public async Task A_handler_blocked_on_another_connection_of_its_loop_completes(TransportKind kind)
    {
        using var relay = new BlockingCollection<string>();
        await using var host = await StartAsync(kind, async context =>
        {
            switch (context.Request.Path.Value)
            {
                case "/take":
                    // Synchronously, on whatever thread runs the handler.
                    string message = relay.Take();
                    await context.Response.WriteAsync($"took {message}");
                    break;
                case "/put":
                    relay.Add(await new StreamReader(context.Request.Body).ReadToEndAsync());
                    await context.Response.WriteAsync("put");
                    break;
                default:
                    await context.Response.WriteAsync("ok");
                    break;
            }
        });

        using var taker = new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large };
        using var putter = new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large };
        Assert.Equal("ok", await taker.GetStringAsync("/first"));
        Assert.Equal("ok", await putter.GetStringAsync("/first"));

        var take = taker.GetStringAsync("/take");
        await Task.Delay(200); // the taker blocks first
        using var put = await putter.PostAsync("/put", new StringContent("the data")).WaitAsync(TestTimeouts.Large);
        Assert.Equal(HttpStatusCode.OK, put.StatusCode);
        Assert.Equal("took the data", await take.WaitAsync(TestTimeouts.Large));
        await host.StopAsync();
    }

    /// <summary>
    /// Handlers that compute for 20 ms of CPU each, over 50 connections that keep sending, while a bystander makes 10
    /// small requests: every kind answers the bystander while the computing load goes on. How long it waits differs,
    /// counted in computing requests done meanwhile (on this 2-CPU machine): with Adaptive scheduling the computing
    /// connections move to the pool and the bystander's stay on the loop, so it waits for a few (about 50 for its 10
    /// requests); on Sockets (each continuation one pool work item, first in first out) and with ThreadPool
    /// scheduling (a loop's dispatch batch runs them one after another) it waits behind most of a round of all 50
    /// each time (about 300 to 400); Inline, left out as for every blocking test, would be about 460. Adaptive is
    /// held to under 200.
    /// </summary>
    [Theory]
    [MemberData(nameof(Transports.AllowBlocking), MemberType = typeof(Transports))]
    public async Task Bystanders_are_answered_while_handlers_compute(TransportKind kind)
    {
        const int Computers = 50;
        const int BystanderRequests = 10;
        const int MostComputedWithAdaptive = 200;
        int computed = 0;
        await using var host = await StartAsync(kind, async context =>
        {
            if (context.Request.Path == "/compute")
            {
                ComputeFor(TimeSpan.FromMilliseconds(20));
                Interlocked.Increment(ref computed);
            }

            await context.Response.WriteAsync("ok");
        });

        var computers = Enumerable.Range(0, Computers).Select(_ => new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large }).ToList();
        using var bystander = new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large };
        using var stop = new CancellationTokenSource();
        try
        {
            Assert.Equal("ok", await bystander.GetStringAsync("/first"));
            var load = Task.WhenAll(computers.Select(async c =>
            {
                while (!stop.IsCancellationRequested)
                {
                    Assert.Equal("ok", await c.GetStringAsync("/compute"));
                }
            }));

            for (int i = 0; i < BystanderRequests; i++)
            {
                Assert.Equal("ok", await bystander.GetStringAsync("/bystander").WaitAsync(TestTimeouts.Large));
            }

            int computedMeanwhile = Volatile.Read(ref computed);
            await stop.CancelAsync();
            await load.WaitAsync(TestTimeouts.Large);
            output.WriteLine($"{kind}: {BystanderRequests} bystander requests answered while {computedMeanwhile} computing ones were");
            if (kind.RunsContinuationsOnLoop())
            {
                Assert.True(computedMeanwhile < MostComputedWithAdaptive, $"the bystander's {BystanderRequests} requests took as long as {computedMeanwhile} computing ones");
            }
        }
        finally
        {
            computers.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>
    /// After loops were moved off blocked threads, the extra threads wait as standbys and retire: the loops'
    /// threads come back to one per loop.
    /// </summary>
    [Fact]
    public async Task Threads_taken_over_by_blocking_handlers_retire()
    {
        const TransportKind Kind = TransportKind.LinuxAdaptive;
        int blocked = 0;
        await using var host = await StartAsync(Kind, async context =>
        {
            if (context.Request.Path == "/block")
            {
                Interlocked.Increment(ref blocked);
                Thread.Sleep(300);
            }

            await context.Response.WriteAsync("ok");
        }, o => o.Tuning.StandbyRetireMilliseconds = 200);

        var threads = LinuxFactory(host).LoopThreads!;
        var clients = Enumerable.Range(0, 6).Select(_ => new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large }).ToList();
        try
        {
            foreach (var client in clients)
            {
                Assert.Equal("ok", await client.GetStringAsync("/first"));
            }

            await Task.WhenAll(clients.Select(c => c.GetStringAsync("/block"))).WaitAsync(TestTimeouts.Large);
        }
        finally
        {
            clients.ForEach(c => c.Dispose());
        }

        int most = threads.Count;
        output.WriteLine($"{blocked} blocking requests; {most} loop threads right after them");
        var deadline = Stopwatch.StartNew();
        while ((threads.Count > 1 || LoopThreadsInProcess() > 1) && deadline.Elapsed < TestTimeouts.Default)
        {
            await Task.Delay(50);
        }

        Assert.Equal(1, threads.Count);
        Assert.Equal(1, LoopThreadsInProcess());
        await host.StopAsync();
        Assert.Equal(0, threads.Count);
    }

    /// <summary>
    /// The meter shows a handler that blocks its loop: with Inline scheduling the loop's current pass grows while
    /// it blocks (a gauge) and counts as a long pass after; with Adaptive scheduling the loop is handed off.
    /// </summary>
    [Theory]
    [InlineData(TransportKind.LinuxInline)]
    [InlineData(TransportKind.LinuxAdaptive)]
    public async Task A_handler_that_blocks_its_loop_shows_in_the_meter(TransportKind kind)
    {
        var blocking = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        using var release = new ManualResetEventSlim();
        await using var host = await StartAsync(kind, async context =>
        {
            if (context.Request.Path == "/block")
            {
                blocking.TrySetResult();
                release.Wait(TestTimeouts.Default);
            }

            await context.Response.WriteAsync("ok");
        });

        using var recorder = new MeasurementRecorder(host.App.Services.GetRequiredService<System.Diagnostics.Metrics.IMeterFactory>());
        using var client = new HttpClient { BaseAddress = host.Address, Timeout = TestTimeouts.Large };
        Assert.Equal("ok", await client.GetStringAsync("/first"));
        var blocked = client.GetStringAsync("/block");
        await blocking.Task.WaitAsync(TestTimeouts.Default);
        await Task.Delay(200);
        recorder.Collect();
        double passSeconds = recorder.Max("kestrel.transport.linux.loop.current_pass.duration");
        output.WriteLine($"current pass {passSeconds:F3} s, handoffs {recorder.Sum("kestrel.transport.linux.loop.handoffs")}, long passes {recorder.Sum("kestrel.transport.linux.loop.long_passes")}");
        release.Set();
        Assert.Equal("ok", await blocked.WaitAsync(TestTimeouts.Default));

        if (kind == TransportKind.LinuxInline)
        {
            Assert.True(passSeconds >= 0.15, $"the blocked loop's current pass read {passSeconds:F3} s");
            var deadline = Stopwatch.StartNew();
            while (recorder.Sum("kestrel.transport.linux.loop.long_passes") == 0 && deadline.Elapsed < TestTimeouts.Default)
            {
                await Task.Delay(10);
            }

            Assert.Equal(1, recorder.Sum("kestrel.transport.linux.loop.long_passes"));
            Assert.Equal(0, recorder.Sum("kestrel.transport.linux.loop.handoffs"));
        }
        else
        {
            // The loop moved on: its current pass is the new holder's, and short.
            Assert.True(passSeconds < 0.15, $"the loop's current pass read {passSeconds:F3} s although the loop had moved");
            Assert.Equal(1, recorder.Sum("kestrel.transport.linux.loop.handoffs"));
        }

        await host.StopAsync();
    }

    private Task<TestHost> StartAsync(TransportKind kind, RequestDelegate handler, Action<LinuxTransportOptions>? linux = null)
        => TestHost.StartAsync(kind, output, handler, s =>
        {
            s.Kestrel = k => k.AllowSynchronousIO = true;
            s.Linux = o =>
            {
                o.ThreadCount = 1;
                linux?.Invoke(o);
            };
        });

    private static LinuxTransportFactory LinuxFactory(TestHost host)
        => Assert.IsType<LinuxTransportFactory>(host.App.Services.GetServices<IConnectionListenerFactory>().Last());

    /// <summary>Spins until this thread has used <paramref name="cpu"/> of CPU time (not wall time, which threads sharing a CPU would all count).</summary>
    private static void ComputeFor(TimeSpan cpu)
    {
        long until = ThreadCpuNanoseconds() + (long)(cpu.TotalMilliseconds * 1_000_000);
        while (ThreadCpuNanoseconds() < until)
        {
            Thread.SpinWait(100);
        }
    }

    private static long ThreadCpuNanoseconds()
    {
        const int ClockThreadCpuTimeId = 3; // clock_gettime(2)
        Assert.Equal(0, clock_gettime(ClockThreadCpuTimeId, out var time));
        return (time.Seconds * 1_000_000_000) + time.Nanoseconds;
    }

    [System.Runtime.InteropServices.DllImport("libc", SetLastError = true)]
    private static extern int clock_gettime(int clock, out Timespec time);

    private readonly struct Timespec
    {
        public readonly long Seconds;
        public readonly long Nanoseconds;
    }

    /// <summary>Blocks the calling thread in the way <paramref name="how"/> names until <paramref name="release"/> completes, or <see cref="MostBlock"/> has passed.</summary>
    private static void Block(Blocking how, object contended, Task release)
    {
        switch (how)
        {
            case Blocking.Sleep:
                var started = Stopwatch.GetTimestamp();
                while (!release.IsCompleted && Stopwatch.GetElapsedTime(started) < MostBlock)
                {
                    Thread.Sleep(20);
                }

                break;
            case Blocking.TaskResult:
                _ = release.WaitAsync(MostBlock).ContinueWith(_ => 1, TaskScheduler.Default).Result;
                break;
            case Blocking.ContendedLock:
                lock (contended)
                {
                }

                break;
        }
    }

    /// <summary>
    /// A thread that holds <paramref name="contended"/> until <paramref name="release"/> completes (or
    /// <see cref="MostBlock"/> has passed), returned once it holds it. Released by the test, never by a clock, so a
    /// handler that is slow to be scheduled (the pool on a loaded machine) still finds the lock taken.
    /// </summary>
    private static Thread HoldLock(object contended, Task release)
    {
        using var holding = new ManualResetEventSlim();
        var thread = new Thread(() =>
        {
            lock (contended)
            {
                holding.Set();
                release.Wait(MostBlock);
            }
        })
        { IsBackground = true };
        thread.Start();
        holding.Wait();
        return thread;
    }

    /// <summary>Threads of this process whose kernel name says they hold or held an event loop (the name is cut at 15 bytes).</summary>
    private static int LoopThreadsInProcess()
        => Directory.GetDirectories("/proc/self/task").Count(task =>
        {
            try
            {
                return File.ReadAllText(Path.Combine(task, "comm")).StartsWith("Kestrel Linux l", StringComparison.Ordinal);
            }
            catch (IOException)
            {
                return false;
            }
        });

    private static async Task<string> ReadResponseAsync(NetworkStream stream)
    {
        var buffer = new byte[4096];
        var text = new StringBuilder();
        while (true)
        {
            int read = await stream.ReadAsync(buffer);
            Assert.True(read > 0, $"the connection closed; so far: {text}");
            text.Append(Encoding.ASCII.GetString(buffer, 0, read));
            string s = text.ToString();
            int head = s.IndexOf("\r\n\r\n", StringComparison.Ordinal);
            if (head < 0)
            {
                continue;
            }

            var lengthLine = s[..head].Split("\r\n").FirstOrDefault(l => l.StartsWith("Content-Length:", StringComparison.OrdinalIgnoreCase));
            if (lengthLine is not null && s.Length >= head + 4 + int.Parse(lengthLine["Content-Length:".Length..].Trim(), System.Globalization.CultureInfo.InvariantCulture))
            {
                return s;
            }

            if (lengthLine is null && s.EndsWith("0\r\n\r\n", StringComparison.Ordinal))
            {
                return s;
            }
        }
    }
}
