using System.Diagnostics;
using System.Globalization;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Faults;

/// <summary>Running out of file descriptors while clients keep connecting is survived and recovered from.</summary>
[Collection(QuietProcess.Name)]
public sealed class AcceptStormTests(ITestOutputHelper output)
{
    private const int Headroom = 16;

    // The client process's stdin, stdout and stderr pipes, which this process holds while it runs.
    private const int ClientProcessDescriptors = 3;
    private const int StormConnections = 200;
    private static readonly TimeSpan s_recoveryBound = TimeSpan.FromSeconds(10);

    // The clients live in a child process: they must not need descriptors from this one while it has none.
    private const string Script = """
        import selectors, socket, sys, time

        socks, collected = [], 0

        def connect(target):
            # A path is a Unix socket; anything else is a port on 127.0.0.1.
            if target.startswith("/"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(30)
                s.connect(target)
                return s
            return socket.create_connection(("127.0.0.1", int(target)), timeout=30)

        for line in sys.stdin:
            command = line.split()
            if command[0] == "open":
                for _ in range(int(command[1])):
                    s = connect(sys.argv[1])
                    s.sendall(("GET /storm/%d HTTP/1.1\r\nHost: localhost\r\n\r\n" % len(socks)).encode())
                    socks.append(s)
                    time.sleep(0.001)
                print("opened %d" % len(socks), flush=True)
            elif command[0] == "answered":
                selector = selectors.DefaultSelector()
                for s in socks[collected:]:
                    selector.register(s, selectors.EVENT_READ)
                time.sleep(float(command[1]))
                ready = selector.select(timeout=0)
                selector.close()
                print("answered %d of %d" % (len(ready), len(socks) - collected), flush=True)
            elif command[0] == "collect":
                ok, errors = 0, []
                for i in range(collected, len(socks)):
                    socks[i].settimeout(float(command[1]))
                    try:
                        status, body = read_response(socks[i])
                        if status == 200 and body == ("storm %d" % i).encode():
                            ok += 1
                        elif len(errors) < 5:
                            errors.append("connection %d: %d %r" % (i, status, body))
                    except Exception as e:
                        if len(errors) < 5:
                            errors.append("connection %d: %r" % (i, e))
                    socks[i].close()
                count, collected = len(socks) - collected, len(socks)
                print("collected %d of %d errors: %s" % (ok, count, "; ".join(errors) or "none"), flush=True)
        """;

    /// <summary>
    /// Each transport over TCP (a SO_REUSEPORT listener per loop) and over a Unix socket (one listener every loop
    /// polls with EPOLLEXCLUSIVE, which a backoff must take out of the epoll set rather than modify).
    /// </summary>
    public static TheoryData<TransportKind, bool> Kinds => new()
    {
        { TransportKind.Sockets, false },
        { TransportKind.LinuxNative, false },
        { TransportKind.Sockets, true },
        { TransportKind.LinuxNative, true },
        { TransportKind.LinuxIoUring, false },
        { TransportKind.LinuxIoUring, true },
    };

    /// <summary>
    /// Proves that when the process runs out of descriptors (soft RLIMIT_NOFILE lowered to 16 above what is
    /// open) while 200 clients connect, the server neither crashes nor stops accepting for good: the Linux
    /// transport logs and counts the EMFILE accept errors, backs each listener off instead of retrying on every
    /// pass, and once the limit is restored every waiting client and every new one is served.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task An_accept_storm_under_EMFILE_is_survived_counted_and_recovered_from(TransportKind kind, bool unixSocket)
    {
        var (soft, _) = FileDescriptorLimit.Get();
        try
        {
            await StormAsync(kind, unixSocket, soft);
        }
        finally
        {
            FileDescriptorLimit.SetSoft(soft);
        }
    }

    private async Task StormAsync(TransportKind kind, bool unixSocket, ulong soft)
    {
        var socketPath = Path.Combine(Path.GetTempPath(), $"ktl-storm-{Guid.NewGuid():N}.sock");
        using var meter = new TransportMeter();
        var logs = new LogRecorder();
        Task<TestHost> StartHostAsync() => StartStormHostAsync(kind, logs, s =>
        {
            if (unixSocket)
            {
                s.Kestrel = k => k.ListenUnixSocket(socketPath);
            }
        });

        if (kind.UsesIoUring())
        {
            await LowerLimitBeforeStartAsync(StartHostAsync);
        }

        await using var host = await StartHostAsync();
        await using var clients = PythonClient.Start(Script, unixSocket ? socketPath : host.Address.Port.ToString(CultureInfo.InvariantCulture));
        Assert.Equal("opened 4", await clients.CommandAsync("open 4", TestTimeouts.Default));
        Assert.Equal("collected 4 of 4 errors: none", await clients.CommandAsync("collect 10", TestTimeouts.Default));

        StartThreadPoolThreads(32);
        var open = ProcessResources.OpenFileDescriptors().Count;
        string answered;
        if (!kind.UsesIoUring())
        {
            FileDescriptorLimit.SetSoft((ulong)(open + Headroom));
        }

        Assert.Equal($"opened {4 + StormConnections}", await clients.CommandAsync($"open {StormConnections}", TestTimeouts.Default));
        answered = await clients.CommandAsync("answered 0.5", TestTimeouts.Default);
        var limit = FileDescriptorLimit.Get().Soft;
        FileDescriptorLimit.SetSoft(soft);

        var stopwatch = Stopwatch.StartNew();
        var collected = await clients.CommandAsync($"collect {s_recoveryBound.TotalSeconds}", s_recoveryBound * 2);
        var recovery = stopwatch.Elapsed;

        var emfile = meter.Sum("kestrel.transport.linux.accept.errors", "EMFILE");
        Figures.Report(output, $"Accept storm under EMFILE ({(unixSocket ? "Unix socket" : "TCP")})", kind, $"soft RLIMIT_NOFILE set to {limit} with {open} open; {StormConnections} clients connected: {answered} while limited; EMFILE accept errors counted: {emfile}; after the limit was restored all were answered in {recovery.TotalSeconds:F1} s");

        var waiting = int.Parse(answered.Split(' ')[1], CultureInfo.InvariantCulture);
        Assert.True(waiting < StormConnections, $"With {Headroom} descriptors to spare, {waiting} of {StormConnections} connections were answered: the storm never ran the server out of descriptors, so this test proved nothing.");
        Assert.Equal($"collected {StormConnections} of {StormConnections} errors: none", collected);

        // New clients too, after the storm.
        Assert.Equal($"opened {4 + StormConnections + 20}", await clients.CommandAsync("open 20", TestTimeouts.Default));
        Assert.Equal("collected 20 of 20 errors: none", await clients.CommandAsync("collect 10", TestTimeouts.Default));

        if (kind.IsLinux())
        {
            Assert.True(emfile > 0, "The Linux transport did not count an EMFILE accept error in kestrel.transport.linux.accept.errors.");

            // The backoff doubles from 10 ms, so each of the two loops retries a handful of times in the window of
            // about a second; a listener that stayed in the epoll set would fail an accept on every pass, thousands.
            Assert.True(emfile <= 50, $"{emfile} EMFILE accept errors: the listener was retried on every pass instead of being backed off.");
            // TransportLog.AcceptFailed, with Errno.Describe's "(errno 24)": EMFILE.
            Assert.Contains(logs.Warnings, w => w.Contains("accept on", StringComparison.Ordinal) && w.Contains("(errno 24)", StringComparison.Ordinal));
        }

        logs.AssertNone("Running out of descriptors");
        await host.StopAsync();
    }

    /// <summary>
    /// On io_uring an accept that fails for want of descriptors ends the kernel's multishot accept, and the listener
    /// backs off. A client that connects meanwhile must wait in the backlog and be served once descriptors are free,
    /// not be accepted by an accept queued again in the same submission as the backoff's removal and then closed as
    /// the removed accept's socket. Descriptors come free at the worst moment here: the transport's own warning about
    /// the EMFILE, logged on the loop thread, frees them, between that accept's failure and the loop's next
    /// submission. Before, that client got an empty reply.
    /// </summary>
    [Fact]
    public async Task A_client_queued_while_an_io_uring_accept_backs_off_from_EMFILE_is_served_not_dropped()
    {
        var (soft, _) = FileDescriptorLimit.Get();
        var reserve = new List<Microsoft.Win32.SafeHandles.SafeFileHandle>();
        try
        {
            await BackOffAsync(soft, reserve);
        }
        finally
        {
            lock (reserve)
            {
                reserve.ForEach(h => h.Dispose());
            }

            FileDescriptorLimit.SetSoft(soft);
        }
    }

    private async Task BackOffAsync(ulong soft, List<Microsoft.Win32.SafeHandles.SafeFileHandle> reserve)
    {
        var logs = new LogRecorder
        {
            OnWarning = warning =>
            {
                if (warning.Contains("accept on", StringComparison.Ordinal) && warning.Contains("(errno 24)", StringComparison.Ordinal))
                {
                    lock (reserve)
                    {
                        reserve.ForEach(h => h.Dispose());
                        reserve.Clear();
                    }
                }
            },
        };
        Task<TestHost> StartHostAsync() => StartStormHostAsync(TransportKind.LinuxIoUring, logs, s => s.Linux = o => o.ThreadCount = 1);
        await LowerLimitBeforeStartAsync(StartHostAsync);
        await using var host = await StartHostAsync();
        await using var clients = PythonClient.Start(Script, host.Address.Port.ToString(CultureInfo.InvariantCulture));
        Assert.Equal("opened 1", await clients.CommandAsync("open 1", TestTimeouts.Default));
        Assert.Equal("collected 1 of 1 errors: none", await clients.CommandAsync("collect 10", TestTimeouts.Default));

        // Every descriptor the limit leaves is taken, so the next accept fails with EMFILE.
        StartThreadPoolThreads(32);
        lock (reserve)
        {
            while (true)
            {
                try
                {
                    reserve.Add(File.OpenHandle("/dev/null"));
                }
                catch (IOException)
                {
                    break;
                }
            }
        }

        Assert.True(reserve.Count > 0, "No descriptor was left to take: the limit did not leave the room it should.");
        Assert.Equal("opened 2", await clients.CommandAsync("open 1", TestTimeouts.Default));
        var collected = await clients.CommandAsync("collect 10", TestTimeouts.Default);
        FileDescriptorLimit.SetSoft(soft);
        output.WriteLine($"The client that connected during the backoff: {collected}");

        Assert.Contains(logs.Warnings, w => w.Contains("accept on", StringComparison.Ordinal) && w.Contains("(errno 24)", StringComparison.Ordinal));
        Assert.Equal("collected 1 of 1 errors: none", collected);
        logs.AssertNone("A client queued during an accept's backoff");
        await host.StopAsync();
    }

    /// <summary>A host that answers GET /storm/N with "storm N", its log recorded by <paramref name="logs"/>.</summary>
    private Task<TestHost> StartStormHostAsync(TransportKind kind, LogRecorder logs, Action<TestHostSettings> configure) => TestHost.StartAsync(
        kind,
        output,
        context =>
        {
            var body = "storm " + context.Request.Path.Value!.Split('/')[2];
            context.Response.ContentLength = body.Length;
            return context.Response.WriteAsync(body);
        },
        s =>
        {
            s.Builder = logs.AddTo;
            configure(s);
        });

    /// <summary>
    /// io_uring reads RLIMIT_NOFILE when it arms an accept (io_accept_prep), not when it accepts: a multishot accept
    /// armed before the limit was lowered goes on accepting past it. So on the ring the limit is lowered before the
    /// host starts, leaving <see cref="Headroom"/> beyond what a trial start showed the host and the client process open.
    /// </summary>
    private static async Task LowerLimitBeforeStartAsync(Func<Task<TestHost>> startHost)
    {
        int before = ProcessResources.OpenFileDescriptors().Count;
        await using (await startHost())
        {
            before -= ProcessResources.OpenFileDescriptors().Count;
        }

        FileDescriptorLimit.SetSoft((ulong)(ProcessResources.OpenFileDescriptors().Count - before + ClientProcessDescriptors + Headroom));
    }

    /// <summary>
    /// The runtime itself cannot start a thread while the process has no descriptor left: it fails fast with
    /// "Out of memory." (strace showed it opening /proc/self/status right after clone3 and aborting on EMFILE).
    /// That is the runtime's limit, not the transport's, so the thread pool gets its threads before the storm
    /// (idle workers live for 20 s), and the window without descriptors is kept short.
    /// </summary>
    private static void StartThreadPoolThreads(int count)
    {
        ThreadPool.GetMinThreads(out var workers, out var completionPorts);
        ThreadPool.SetMinThreads(Math.Max(workers, count), completionPorts);
        using var running = new CountdownEvent(count);
        var tasks = Enumerable.Range(0, count).Select(_ => Task.Run(() =>
        {
            running.Signal();
            running.Wait(TestTimeouts.Default);
        })).ToArray();
        Task.WaitAll(tasks, TestTimeouts.Default);
        ThreadPool.SetMinThreads(workers, completionPorts);
    }
}
