using System.Collections.Concurrent;
using System.Diagnostics;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// Adaptive scheduling is safe for users who never chose it (issue 38): a loop whose holder blocks always has a way
/// forward, past the thread cap too; a thread that cannot start, or a logger that throws, costs a hand-off, never
/// the process or a loop; and where the threads' state cannot be read, the loops schedule as ThreadPool does, and
/// say so. Every server here has one loop, with the default thread cap unless a case says otherwise.
/// </summary>
public sealed class AdaptiveSafetyTests(ITestOutputHelper output)
{
    /// <summary>
    /// Eight handlers wait, each on its loop's thread, for a message that only a later request on the same loop puts:
    /// with one loop the default cap is 8 threads, so the last taker leaves no thread for the loop unless the cap
    /// gives. All sixteen are answered, and the server stops within 10 s.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task Handlers_waiting_for_later_requests_of_their_loop_complete_past_the_default_thread_cap(TransportKind kind)
    {
        const int Pairs = 8;
        using var relay = new BlockingCollection<string>();
        int waiting = 0;
        await using var host = await AdaptiveTesting.StartAsync(kind, output, async context =>
        {
            switch (context.Request.Path.Value)
            {
                case "/take":
                    Interlocked.Increment(ref waiting);
                    string message = relay.Take(); // synchronously, on whatever thread runs the handler
                    await context.Response.WriteAsync($"took {message}");
                    break;
                case "/put":
                    relay.Add(context.Request.Query["m"].ToString());
                    await context.Response.WriteAsync("put");
                    break;
                default:
                    await context.Response.WriteAsync("ok");
                    break;
            }
        });

        var takers = await AdaptiveTesting.WarmedAsync(host, Pairs);
        var putters = await AdaptiveTesting.WarmedAsync(host, Pairs);
        try
        {
            var takes = takers.Select(c => AdaptiveTesting.GetAsync(c, "/take", TestTimeouts.Default)).ToList();
            await AdaptiveTesting.WaitUntilAsync(() => Volatile.Read(ref waiting) == Pairs, TestTimeouts.Default, "every taker to wait");
            var puts = putters.Select((c, i) => AdaptiveTesting.GetAsync(c, $"/put?m={i}", TestTimeouts.Default)).ToList();

            Assert.All(await Task.WhenAll(puts).WaitAsync(TestTimeouts.Default), p => Assert.Equal("put", p));
            var took = await Task.WhenAll(takes).WaitAsync(TestTimeouts.Default);
            Assert.Equal(Enumerable.Range(0, Pairs).Select(i => $"took {i}").Order(), took.Order());
            output.WriteLine($"{kind}: {AdaptiveTesting.Factory(host).LoopThreads!.Count} loop threads after the relay");
        }
        finally
        {
            relay.CompleteAdding(); // a taker still waiting (the test failed) ends with an error, not never
            takers.Concat(putters).ToList().ForEach(c => c.Dispose());
        }

        var stopping = Stopwatch.StartNew();
        await host.StopAsync();
        Assert.True(stopping.Elapsed < TimeSpan.FromSeconds(10), $"the server took {stopping.Elapsed.TotalSeconds:F1} s to stop");
    }

    /// <summary>
    /// Eight synchronous reads of request bodies that arrive 200 ms after their headers, on one loop at the default
    /// cap: each read waits for bytes only the loop can receive. All complete, and the server stops within 10 s.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task Synchronous_reads_of_late_bodies_complete_past_the_default_thread_cap(TransportKind kind)
    {
        const int Readers = 8;
        const int BodyLength = 1000;
        int reading = 0;
        await using var host = await AdaptiveTesting.StartAsync(kind, output, async context =>
        {
            if (context.Request.Path == "/read")
            {
                Interlocked.Increment(ref reading);
                var buffer = new byte[4096];
                long total = 0;
                int read;
                while ((read = context.Request.Body.Read(buffer)) > 0)
                {
                    total += read;
                }

                await context.Response.WriteAsync($"read {total}");
                return;
            }

            await context.Response.WriteAsync("ok");
        });

        var readers = await AdaptiveTesting.WarmedAsync(host, Readers);
        try
        {
            await Task.WhenAll(readers.Select(c => c.SendAsync($"POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: {BodyLength}\r\n\r\n", TestTimeouts.Default)));
            await AdaptiveTesting.WaitUntilAsync(() => Volatile.Read(ref reading) == Readers, TestTimeouts.Default, "every handler to read");
            await Task.Delay(200);
            await Task.WhenAll(readers.Select(c => c.SendAsync(new byte[BodyLength], TestTimeouts.Default)));

            var responses = await Task.WhenAll(readers.Select(c => c.ReadResponseAsync(TestTimeouts.Default))).WaitAsync(TestTimeouts.Default);
            Assert.All(responses, r => Assert.Equal($"read {BodyLength}", r.BodyText));
        }
        finally
        {
            readers.ForEach(c => c.Dispose());
        }

        var stopping = Stopwatch.StartNew();
        await host.StopAsync();
        Assert.True(stopping.Elapsed < TimeSpan.FromSeconds(10), $"the server took {stopping.Elapsed.TotalSeconds:F1} s to stop");
    }

    /// <summary>
    /// At the hard ceiling (here one thread: LoopThreadLimit and LoopThreadCeiling 1) a handler that does not return keeps
    /// its loop; a stop still goes through. Kestrel's unbind is work posted to that loop, and it gets a thread beyond the
    /// ceiling: the server's stop (unbind, a 1 s graceful wait, the aborts) returns within 10 s while the handler still
    /// blocks. The host is disposed without the memory check: the handler, released after the stop, writes its response
    /// after the transport's pools were disposed (Kestrel rents for writes to an aborted connection).
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task A_stop_ends_a_loop_held_by_a_handler_that_does_not_return(TransportKind kind)
    {
        using var release = new ManualResetEventSlim();
        using var blocking = new ManualResetEventSlim();
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    blocking.Set();
                    release.Wait(TestTimeouts.Large);
                }

                await context.Response.WriteAsync("ok");
            },
            o =>
            {
                o.Tuning.LoopThreadLimit = 1;
                o.Tuning.LoopThreadCeiling = 1;
            },
            s => s.Builder = b => b.Services.Configure<HostOptions>(h => h.ShutdownTimeout = TimeSpan.FromSeconds(1)));

        var blocker = (await AdaptiveTesting.WarmedAsync(host, 1))[0];
        try
        {
            await blocker.SendAsync(RawHttpRequest.Get("/block"), TestTimeouts.Default);
            Assert.True(blocking.Wait(TestTimeouts.Default), "the handler never ran");
            await Task.Delay(100); // the monitor has looked, and found no thread for the loop

            var stopping = Stopwatch.StartNew();
            await host.BeginStop().WaitAsync(TimeSpan.FromSeconds(10));
            output.WriteLine($"{kind}: stopped in {stopping.Elapsed.TotalSeconds:F1} s while the handler blocked");
            Assert.True(stopping.Elapsed < TimeSpan.FromSeconds(10), $"the server took {stopping.Elapsed.TotalSeconds:F1} s to stop");
        }
        finally
        {
            release.Set();
            blocker.Dispose();
        }
    }

    /// <summary>
    /// When not even a stop can get a thread for a loop that a handler holds (here Thread.Start throws, and the caps allow
    /// no thread but the loop's own), the transport's stop gives up on that loop after 5 s, says so, and returns; the loop
    /// ends once the handler returns. The host is disposed without the memory check: the handler writes its response
    /// after the transport's pools were disposed.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task A_stop_gives_up_on_a_loop_no_thread_can_take_and_says_so(TransportKind kind)
    {
        var log = new TransportLogLines();
        using var release = new ManualResetEventSlim();
        using var blocking = new ManualResetEventSlim();
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    blocking.Set();
                    release.Wait(TestTimeouts.Large);
                }

                await context.Response.WriteAsync("ok");
            },
            o =>
            {
                o.Tuning.LoopThreadLimit = 1;
                o.Tuning.LoopThreadCeiling = 1;
            },
            s => s.Builder = b => b.Logging.AddProvider(log));

        var factory = AdaptiveTesting.Factory(host);
        var loop = factory.Loops[0];
#pragma warning disable CA2201 // What Thread.Start throws when pthread_create fails (EAGAIN under pids.max or RLIMIT_NPROC).
        factory.LoopThreads!.StartThread = static _ => throw new OutOfMemoryException("Thread creation failed (the test's seam).");
#pragma warning restore CA2201
        var blocker = (await AdaptiveTesting.WarmedAsync(host, 1))[0];
        try
        {
            await blocker.SendAsync(RawHttpRequest.Get("/block"), TestTimeouts.Default);
            Assert.True(blocking.Wait(TestTimeouts.Default), "the handler never ran");

            var stopping = Stopwatch.StartNew();
            await factory.DisposeAsync().AsTask().WaitAsync(TimeSpan.FromSeconds(10));
            output.WriteLine($"{kind}: the transport stopped in {stopping.Elapsed.TotalSeconds:F1} s while the handler blocked");
            Assert.NotEmpty(log.With(30, LogLevel.Warning));
            Assert.False(loop.Stopped.IsCompleted, "the held loop stopped while its handler still blocked");
        }
        finally
        {
            release.Set();
            blocker.Dispose();
        }
    }

    /// <summary>
    /// Thread.Start can throw (pids.max, RLIMIT_NPROC, memory). Then the hand-off is refused, counted and logged, and
    /// the loop stays with its blocked holder until the handler returns: the process lives and every request is
    /// answered. Once threads start again, the next block is handed off.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task A_thread_that_fails_to_start_refuses_the_hand_off_and_the_server_goes_on(TransportKind kind)
    {
        var log = new TransportLogLines();
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    Thread.Sleep(500);
                }

                await context.Response.WriteAsync("ok");
            },
            settings: s => s.Builder = b => b.Logging.AddProvider(log));

        using var meter = new TaggedMeasurements(host);
        var threads = AdaptiveTesting.Factory(host).LoopThreads!;
#pragma warning disable CA2201 // What Thread.Start throws when pthread_create fails (EAGAIN under pids.max or RLIMIT_NPROC).
        threads.StartThread = static _ => throw new OutOfMemoryException("Thread creation failed (the test's seam).");
#pragma warning restore CA2201
        var connections = await AdaptiveTesting.WarmedAsync(host, 6);
        try
        {
            var blocked = AdaptiveTesting.GetAsync(connections[0], "/block", TestTimeouts.Default);
            await Task.Delay(100);
            var others = connections.Skip(2).Select(c => AdaptiveTesting.GetAsync(c, "/other", TestTimeouts.Default));
            Assert.All(await Task.WhenAll(others), r => Assert.Equal("ok", r));
            Assert.Equal("ok", await blocked);

            meter.Collect();
            output.WriteLine($"refused: {meter.Describe("kestrel.transport.linux.loop.handoffs.refused")}");
            Assert.True(meter.Sum("kestrel.transport.linux.loop.handoffs.refused", "error.type=thread_start_failed") >= 1);
            Assert.Equal(0, meter.Sum("kestrel.transport.linux.loop.handoffs"));
            Assert.Contains(log.Lines, l => l.Level == LogLevel.Warning && l.Message.Contains("could not start", StringComparison.Ordinal));

            // Threads start again: the next block is handed off.
            threads.StartThread = static t => t.Start();
            Assert.Equal("ok", await AdaptiveTesting.GetAsync(connections[1], "/block", TestTimeouts.Default));
            meter.Collect();
            Assert.Equal(1, meter.Sum("kestrel.transport.linux.loop.handoffs"));
        }
        finally
        {
            connections.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>
    /// A logging provider that throws (a disposed one at shutdown, say) on the hand-off warning, after one 50 ms block:
    /// the exception reaches neither the monitor nor the thread the loop was taken from, so no loop is stopped and two
    /// threads never run one loop. Then 1,000 requests over 20 connections are all answered.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task A_logger_that_throws_on_the_hand_off_warning_stops_no_loop(TransportKind kind)
    {
        var throwing = new ThrowingOnEvent(22);
        var log = new TransportLogLines();
        await using var host = await AdaptiveTesting.StartAsync(
            kind,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    Thread.Sleep(50);
                }

                await context.Response.WriteAsync("ok");
            },
            settings: s => s.Builder = b =>
            {
                b.Logging.AddProvider(throwing);
                b.Logging.AddProvider(log);
            });

        var loops = AdaptiveTesting.Factory(host).Loops;
        var connections = await AdaptiveTesting.WarmedAsync(host, 20);
        try
        {
            Assert.Equal("ok", await AdaptiveTesting.GetAsync(connections[0], "/block", TestTimeouts.Default));
            await AdaptiveTesting.WaitUntilAsync(() => throwing.Thrown > 0, TestTimeouts.Default, "the hand-off warning");

            int answered = 0;
            await Task.WhenAll(connections.Select(async c =>
            {
                for (int i = 0; i < 50; i++)
                {
                    Assert.Equal("ok", await AdaptiveTesting.GetAsync(c, "/after", TestTimeouts.Default));
                    Interlocked.Increment(ref answered);
                }
            })).WaitAsync(TestTimeouts.Large);

            Assert.Equal(1000, answered);
            Assert.All(loops, l => Assert.False(l.Stopped.IsCompleted, $"loop {l.Index} stopped"));
            Assert.Empty(log.With(11)); // LoopFailed
        }
        finally
        {
            connections.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>
    /// Where /proc/self/task/TID/stat and schedstat cannot be read (gVisor, a masked /proc, WSL1; here the test points
    /// the transport at a directory that does not exist), the monitor could never see a blocked holder: the loops
    /// schedule as ThreadPool does, with a warning, and bystanders are answered while a handler blocks for 2 s.
    /// The host starts as the kind's ThreadPool twin, since that is what its loops then report.
    /// </summary>
    [Theory]
    [MemberData(nameof(AdaptiveTesting.Kinds), MemberType = typeof(AdaptiveTesting))]
    public async Task Without_readable_thread_stats_Adaptive_schedules_as_ThreadPool_and_says_so(TransportKind kind)
    {
        var log = new TransportLogLines();
        var blocking = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        long returnedAt = 0;
        var twin = kind == TransportKind.LinuxIoUringAdaptive ? TransportKind.LinuxIoUring : TransportKind.LinuxNative;
        await using var host = await AdaptiveTesting.StartAsync(
            twin,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    blocking.TrySetResult();
                    Thread.Sleep(2000);
                    Volatile.Write(ref returnedAt, Stopwatch.GetTimestamp());
                }

                await context.Response.WriteAsync("ok");
            },
            o =>
            {
                o.ApplicationSchedulingMode = ApplicationSchedulingMode.Adaptive;
                o.Tuning.ThreadStatsDirectory = "/proc/self/task-not-readable-in-this-test";
            },
            s => s.Builder = b => b.Logging.AddProvider(log));

        var connections = await AdaptiveTesting.WarmedAsync(host, 5);
        try
        {
            var blocked = AdaptiveTesting.GetAsync(connections[0], "/block", TestTimeouts.Default);
            await blocking.Task.WaitAsync(TestTimeouts.Default);
            var answeredAt = new ConcurrentBag<long>();
            await Task.WhenAll(connections.Skip(1).Select(async c =>
            {
                for (int i = 0; i < 5; i++)
                {
                    Assert.Equal("ok", await AdaptiveTesting.GetAsync(c, "/bystander", TestTimeouts.Default));
                    answeredAt.Add(Stopwatch.GetTimestamp());
                }
            }));

            Assert.Equal("ok", await blocked);
            long returned = Volatile.Read(ref returnedAt);
            Assert.All(answeredAt, at => Assert.True(at < returned, "a bystander was answered only after the blocked handler returned"));
            Assert.All(AdaptiveTesting.Factory(host).Loops, l => Assert.False(l.RunsContinuations));
            string warning = Assert.Single(log.Lines, l => l.Level == LogLevel.Warning && l.Message.Contains("schedstat", StringComparison.Ordinal)).Message;
            output.WriteLine(warning);
        }
        finally
        {
            connections.ForEach(c => c.Dispose());
        }

        await host.StopAsync();
    }

    /// <summary>A logging provider that throws on one event id, as a disposed provider may.</summary>
    private sealed class ThrowingOnEvent(int eventId) : ILoggerProvider
    {
        private int _thrown;

        public int Thrown => Volatile.Read(ref _thrown);

        public ILogger CreateLogger(string categoryName) => new Logger(this, eventId);

        public void Dispose()
        {
        }

        private sealed class Logger(ThrowingOnEvent provider, int eventId) : ILogger
        {
            public IDisposable? BeginScope<TState>(TState state)
                where TState : notnull => null;

            public bool IsEnabled(LogLevel logLevel) => true;

            public void Log<TState>(LogLevel logLevel, EventId id, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
            {
                if (id.Id == eventId)
                {
                    Interlocked.Increment(ref provider._thrown);
                    throw new ObjectDisposedException(nameof(ThrowingOnEvent), $"Thrown on purpose on event {id.Id}.");
                }
            }
        }
    }
}
