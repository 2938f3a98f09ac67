using System.Collections.Concurrent;
using System.Diagnostics;
using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Security.Cryptography;
using System.Text;
using System.Text.Json;
using HdrHistogram;
using RawHttp;

namespace Soak;

/// <summary>
/// The soak's load and its sampler. Workers, each a closed loop with its own seeded random source:
/// <list type="bullet">
/// <item>keep-alive (32): one persistent connection each; 85% <c>GET /plaintext</c>, 15% <c>POST /echo</c> of 16 B-4 KiB;</item>
/// <item>churn (4): a new connection per <c>GET /plaintext</c> with <c>Connection: close</c>;</item>
/// <item>large (2): keep-alive, in turn an upload, a download and a full-duplex echo of 1-8 MiB, each SHA-256 checked;</item>
/// <item>aborts (1, one every 10 ms): RST in the middle of a request body, a response body, the request headers, an echo;</item>
/// <item>bad input (1, one every 10 ms): garbage bytes, a TLS ClientHello, malformed request lines, headers and bodies.</item>
/// </list>
/// Requests that complete as they must count as <c>requests</c>; aborts, and bad input answered with
/// a 4xx or a close, count as <c>expected</c>; anything else (an unexpected status, a checksum
/// mismatch, a timeout, a connection failure on a valid request) is an <c>error</c>.
/// The load first runs unmeasured until 20,000 requests and 2 GiB of bodies are done and 20 s have passed (60 s at most),
/// then one "warm" sample is taken and the measured <c>--seconds</c> start. Every
/// <c>--sample-every</c> seconds the server process is sampled (/proc/PID/status, /proc/PID/fd,
/// /_soak/stats) and one CSV row written.
/// </summary>
public sealed class SoakClient
{
    private const int KeepAliveWorkers = 32;
    private const int ChurnWorkers = 4;
    private const int LargeWorkers = 2;
    private const int MiB = 1024 * 1024;
    private const int MaxHead = 64 * 1024;
    private const long WarmupRequests = 20_000;
    private const long WarmupBodyBytes = 2048L * MiB;
    private static readonly TimeSpan s_warmupLimit = TimeSpan.FromSeconds(60);

    // And at least this long: with Adaptive scheduling the 2 GiB come sooner than RSS settles (soak.sh's header says by how much).
    private static readonly TimeSpan s_warmupMinimum = TimeSpan.FromSeconds(20);
    private static readonly TimeSpan s_smallTimeout = TimeSpan.FromSeconds(30);
    private static readonly TimeSpan s_largeTimeout = TimeSpan.FromSeconds(120);
    // No step outlives its deadline by much; a slower one is clamped to this rather than lost.
    private static readonly long s_maxLatencyUs = (long)(2 * s_largeTimeout).TotalMicroseconds;
    private static readonly TimeSpan s_pace = TimeSpan.FromMilliseconds(10);
    private static readonly byte[] s_plaintext = "GET /plaintext HTTP/1.1\r\nHost: soak\r\n\r\n"u8.ToArray();
    private static readonly byte[] s_plaintextClose = "GET /plaintext HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n"u8.ToArray();
    private static readonly byte[] s_helloHash = SHA256.HashData("Hello, World!"u8);

    private readonly EndPoint _endPoint;
    private readonly int _serverPid;
    private readonly ulong _seed;
    private readonly CancellationToken _stop;
    private readonly ConcurrentQueue<string> _errorMessages = new();
    private readonly ConcurrentDictionary<string, long> _errorKinds = new();
    private readonly ConcurrentDictionary<string, long> _expectedKinds = new();
    private readonly ConcurrentDictionary<string, long> _okKinds = new();
    private readonly ConcurrentDictionary<string, LongConcurrentHistogram> _latencies = new();
    private bool _measuring;
    private long _requests;
    private long _errors;
    private long _expected;
    private long _bodyBytes;

    private SoakClient(EndPoint endPoint, int serverPid, ulong seed, CancellationToken stop)
    {
        _endPoint = endPoint;
        _serverPid = serverPid;
        _seed = seed;
        _stop = stop;
    }

    public static async Task<int> RunAsync(string[] args)
    {
        Uri? url = null;
        int pid = 0, seconds = 60, every = 10;
        ulong seed = 1;
        string? csvPath = null, jsonPath = null;
        for (var i = 0; i + 1 < args.Length; i += 2)
        {
            var value = args[i + 1];
            var ok = args[i] switch
            {
                "--url" => Uri.TryCreate(value, UriKind.Absolute, out url),
                "--server-pid" => int.TryParse(value, CultureInfo.InvariantCulture, out pid),
                "--seconds" => int.TryParse(value, CultureInfo.InvariantCulture, out seconds),
                "--sample-every" => int.TryParse(value, CultureInfo.InvariantCulture, out every),
                "--seed" => ulong.TryParse(value, CultureInfo.InvariantCulture, out seed),
                "--csv" => (csvPath = value) is not null,
                "--json" => (jsonPath = value) is not null,
                _ => false,
            };
            if (!ok)
            {
                Console.Error.WriteLine($"error: bad client argument '{args[i]} {value}'");
                return 2;
            }
        }

        if (url is null || pid <= 0 || seconds <= 0 || every <= 0 || csvPath is null || jsonPath is null || args.Length % 2 != 0)
        {
            Console.Error.WriteLine("error: client needs --url, --server-pid, --seconds, --csv and --json");
            return 2;
        }

        using var stop = new CancellationTokenSource();
        var client = new SoakClient(new IPEndPoint(IPAddress.Parse(url.Host), url.Port), pid, seed, stop.Token);
        return await client.RunAsync(seconds, every, csvPath, jsonPath, stop);
    }

    private async Task<int> RunAsync(int seconds, int every, string csvPath, string jsonPath, CancellationTokenSource stop)
    {
        await using var csv = new StreamWriter(csvPath, append: false, new UTF8Encoding(false));
        await csv.WriteLineAsync(Sample.Header);
        var clock = Stopwatch.StartNew();
        var idle = await SampleAsync("idle", 0);
        await WriteAsync(csv, idle);

        clock.Restart();
        var workers = new List<Task>();
        for (var i = 0; i < KeepAliveWorkers; i++)
        {
            workers.Add(Worker($"keepalive-{i}", i, KeepAliveAsync));
        }

        for (var i = 0; i < ChurnWorkers; i++)
        {
            workers.Add(Worker($"churn-{i}", 100 + i, ChurnAsync));
        }

        for (var i = 0; i < LargeWorkers; i++)
        {
            workers.Add(Worker($"large-{i}", 200 + i, LargeAsync));
        }

        workers.Add(Worker("abort", 300, AbortsAsync));
        workers.Add(Worker("bad", 400, BadInputAsync));

        // Warm-up, not measured: the server's pools, pipe buffers and GC budgets fill up while the load
        // ramps, so RSS climbs for the first ~2 GiB of bodies (about 10 s on an idle 2-vCPU machine, but
        // a minute on a starved one). The measured window starts once that much work is done.
        var warmupReached = false;
        while (clock.Elapsed < s_warmupLimit)
        {
            if (Interlocked.Read(ref _requests) >= WarmupRequests && Interlocked.Read(ref _bodyBytes) >= WarmupBodyBytes
                && clock.Elapsed >= s_warmupMinimum)
            {
                warmupReached = true;
                break;
            }

            await Task.Delay(TimeSpan.FromMilliseconds(250), CancellationToken.None);
        }

        var warmAt = (int)Math.Ceiling(clock.Elapsed.TotalSeconds);
        var pause = TimeSpan.FromSeconds(warmAt) - clock.Elapsed;
        if (pause > TimeSpan.Zero)
        {
            await Task.Delay(pause, CancellationToken.None);
        }

        Volatile.Write(ref _measuring, true);
        var warm = await SampleAsync("warm", warmAt);
        var serverGone = warm is null;
        await WriteAsync(csv, warm);
        for (var t = every; !serverGone; t = Math.Min(t + every, seconds))
        {
            var wait = TimeSpan.FromSeconds(warmAt + t) - clock.Elapsed;
            if (wait > TimeSpan.Zero)
            {
                await Task.Delay(wait, CancellationToken.None);
            }

            var sample = await SampleAsync("load", warmAt + t);
            if (sample is null)
            {
                serverGone = true;
                break;
            }

            await WriteAsync(csv, sample);
            if (t >= seconds)
            {
                break;
            }
        }

        Volatile.Write(ref _measuring, false);
        await stop.CancelAsync();
        if (await Task.WhenAny(Task.WhenAll(workers), Task.Delay(TimeSpan.FromSeconds(60), CancellationToken.None)) is not Task<Task[]> and var finished
            && !finished.IsCompleted)
        {
            Error("stop", "workers did not stop within 60 s of the end of the load");
        }

        // Quiet: every client connection is closed; give the server up to 10 s to close its side.
        var loadEnd = clock.Elapsed.TotalSeconds;
        // Done when Kestrel counts no connection and the fd count held still for a second.
        Sample? quiet = null;
        for (var i = 0; !serverGone && i < 10; i++)
        {
            await Task.Delay(TimeSpan.FromSeconds(1), CancellationToken.None);
            var previous = quiet;
            quiet = await SampleAsync("quiet", (int)Math.Ceiling(clock.Elapsed.TotalSeconds));
            if (quiet is null || (quiet.Connections == 0 && previous is not null && quiet.Fds == previous.Fds))
            {
                break;
            }
        }

        await WriteAsync(csv, quiet);
        var summary = new Dictionary<string, object>
        {
            ["seconds"] = seconds,
            ["warmup_s"] = warmAt,
            ["warmup_reached"] = warmupReached,
            ["load_end_s"] = Math.Round(loadEnd, 1),
            ["requests"] = Interlocked.Read(ref _requests),
            ["errors"] = Interlocked.Read(ref _errors),
            ["expected"] = Interlocked.Read(ref _expected),
            ["body_mb"] = Math.Round(Interlocked.Read(ref _bodyBytes) / (double)MiB, 1),
            ["ok_kinds"] = new SortedDictionary<string, long>(_okKinds),
            ["error_kinds"] = new SortedDictionary<string, long>(_errorKinds),
            ["expected_kinds"] = new SortedDictionary<string, long>(_expectedKinds),
            ["first_errors"] = _errorMessages.ToArray(),
            ["server_gone"] = serverGone,
            ["latency_us"] = LatencySummary(),
        };
        await File.WriteAllTextAsync(jsonPath, JsonSerializer.Serialize(summary, SoakJsonContext.Default.DictionaryStringObject));
        Console.WriteLine(string.Create(CultureInfo.InvariantCulture,
            $"soak client: {summary["requests"]} requests, {summary["errors"]} errors, {summary["expected"]} expected closes/aborts, {summary["body_mb"]} MiB of bodies verified"));
        foreach (var (kind, latency) in (SortedDictionary<string, SortedDictionary<string, long>>)summary["latency_us"])
        {
            Console.WriteLine(string.Create(CultureInfo.InvariantCulture,
                $"soak client: {kind} latency p50 {latency["p50"]} µs, p99 {latency["p99"]} µs, p99.9 {latency["p99_9"]} µs, max {latency["max"]} µs ({latency["count"]} measured)"));
        }

        return 0;
    }

    private static async Task WriteAsync(StreamWriter csv, Sample? sample)
    {
        if (sample is not null)
        {
            await csv.WriteLineAsync(sample.ToCsv());
            await csv.FlushAsync();
            Console.WriteLine($"soak: {sample.ToCsv()}");
        }
    }

    // ---- the workers ------------------------------------------------------------------------------

    private async Task Worker(string name, int index, Func<Random, WorkerState, Task> step)
    {
        await Task.Yield();
        var random = new Random((int)(_seed * 7919 + (ulong)index));
        var state = new WorkerState(name);
        while (!_stop.IsCancellationRequested)
        {
            try
            {
                await step(random, state);
            }
            catch (Exception) when (_stop.IsCancellationRequested)
            {
                // The load ended in the middle of this step.
            }
            catch (SoakException e)
            {
                Error(e.Kind, $"{name}: {e.Message}");
                state.Drop();
            }
            catch (OperationCanceledException)
            {
                Error("timeout", $"{name}: {state.Operation} did not complete in time");
                state.Drop();
            }
            catch (Exception e) when (e is IOException or SocketException or InvalidDataException)
            {
                Error("connection", $"{name}: {state.Operation}: {e.GetType().Name}: {e.Message}");
                state.Drop();
            }
        }

        state.Drop();
    }

    private CancellationTokenSource Deadline(TimeSpan timeout)
    {
        var cts = CancellationTokenSource.CreateLinkedTokenSource(_stop);
        cts.CancelAfter(timeout);
        return cts;
    }

    private async Task KeepAliveAsync(Random random, WorkerState state)
    {
        var started = Stopwatch.GetTimestamp();
        using var deadline = Deadline(s_smallTimeout);
        var token = deadline.Token;
        state.Connection ??= await ConnectAsync(_endPoint, token);
        bool close;
        if (random.Next(100) < 85)
        {
            state.Operation = "GET /plaintext";
            close = await PlaintextAsync(state.Connection, s_plaintext, token);
            Ok("keepalive-plaintext", started);
        }
        else
        {
            state.Operation = "POST /echo (small)";
            close = await EchoAsync(state.Connection, NextSeed(random), random.Next(16, 4097), token);
            Ok("keepalive-echo", started);
        }

        if (close)
        {
            state.Drop();
        }
    }

    private async Task ChurnAsync(Random random, WorkerState state)
    {
        var started = Stopwatch.GetTimestamp();
        using var deadline = Deadline(s_smallTimeout);
        var token = deadline.Token;
        state.Operation = "connect";
        state.Connection = await ConnectAsync(_endPoint, token);
        state.Operation = "GET /plaintext, Connection: close";
        if (!await PlaintextAsync(state.Connection, s_plaintextClose, token))
        {
            throw new SoakException("status", "no Connection: close in the answer to Connection: close");
        }

        // Half the time wait for the server's close, half the time close first.
        if (random.Next(2) == 0 && !await ServerClosedAsync(state.Connection, token))
        {
            throw new SoakException("status", "bytes after a Connection: close response");
        }

        Ok("churn-plaintext", started);
        state.Drop();
    }

    private async Task LargeAsync(Random random, WorkerState state)
    {
        var started = Stopwatch.GetTimestamp();
        using var deadline = Deadline(s_largeTimeout);
        var token = deadline.Token;
        state.Connection ??= await ConnectAsync(_endPoint, token);
        var size = (long)random.Next(1, 9) * MiB + random.Next(0, 65536);
        var seed = NextSeed(random);
        bool close;
        string kind;
        switch (state.Step++ % 3)
        {
            case 0:
                state.Operation = $"POST /upload ({size} B)";
                close = await UploadAsync(state.Connection, seed, size, token);
                kind = "large-upload";
                break;
            case 1:
                state.Operation = $"GET /download ({size} B)";
                close = await DownloadAsync(state.Connection, seed, size, token);
                kind = "large-download";
                break;
            default:
                state.Operation = $"POST /echo ({size} B)";
                close = await EchoAsync(state.Connection, seed, size, token);
                kind = "large-echo";
                break;
        }

        Ok(kind, started);
        Interlocked.Add(ref _bodyBytes, size);
        if (close)
        {
            state.Drop();
        }
    }

    private async Task AbortsAsync(Random random, WorkerState state)
    {
        await Task.Delay(s_pace, _stop);
        using var deadline = Deadline(s_smallTimeout);
        var token = deadline.Token;
        state.Operation = "connect";
        var connection = state.Connection = await ConnectAsync(_endPoint, token);
        string kind;
        switch (state.Step++ % 4)
        {
            case 0:
                kind = "abort-upload-body";
                state.Operation = kind;
                await connection.SendAsync("POST /upload HTTP/1.1\r\nHost: soak\r\nContent-Length: 4194304\r\n\r\n", token);
                await SendPayloadAsync(connection, NextSeed(random), random.Next(0, MiB), token);
                break;
            case 1:
                kind = "abort-download-body";
                state.Operation = kind;
                await connection.SendAsync($"GET /download?bytes={16 * MiB}&seed=1 HTTP/1.1\r\nHost: soak\r\n\r\n", token);
                await ExpectStatusAsync(connection, 200, token);
                await connection.SkipAsync(random.Next(0, MiB), token);
                break;
            case 2:
                kind = "abort-request-headers";
                state.Operation = kind;
                await connection.SendAsync("GET /plaintext HTTP/1.1\r\nHost: soak\r\nX-Partial: abc", token);
                break;
            default:
                kind = "abort-echo";
                state.Operation = kind;
                await connection.SendAsync($"POST /echo HTTP/1.1\r\nHost: soak\r\nContent-Length: {2 * MiB}\r\n\r\n", token);
                await SendPayloadAsync(connection, NextSeed(random), 256 * 1024, token);
                await ExpectStatusAsync(connection, 200, token);
                await connection.SkipAsync(random.Next(0, 128 * 1024), token);
                break;
        }

        connection.Abort();
        state.Connection = null;
        Expected(kind);
    }

    private static readonly (string Name, Func<Random, byte[]> Bytes)[] s_badInputs =
    [
        ("garbage", r =>
        {
            var bytes = new byte[r.Next(1, 2048) + 4];
            r.NextBytes(bytes);
            "\r\n\r\n"u8.CopyTo(bytes.AsSpan(bytes.Length - 4));
            return bytes;
        }),
        ("tls-client-hello", _ => TlsClientHello()),
        ("no-host", _ => "GET /plaintext HTTP/1.1\r\n\r\n"u8.ToArray()),
        ("bad-header-line", _ => "GET /plaintext HTTP/1.1\r\nHost: soak\r\nThis is not a header\r\n\r\n"u8.ToArray()),
        ("bad-method", _ => "G@T /plaintext HTTP/1.1\r\nHost: soak\r\n\r\n"u8.ToArray()),
        ("bad-target", _ => "GET plaintext HTTP/1.1\r\nHost: soak\r\n\r\n"u8.ToArray()),
        ("nul-in-target", _ => "GET /plain\0text HTTP/1.1\r\nHost: soak\r\n\r\n"u8.ToArray()),
        ("bad-content-length", _ => "POST /upload HTTP/1.1\r\nHost: soak\r\nContent-Length: 12abc\r\n\r\n"u8.ToArray()),
        ("bad-chunk-size", _ => "POST /upload HTTP/1.1\r\nHost: soak\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\nhello\r\n0\r\n\r\n"u8.ToArray()),
        ("headers-too-large", _ => Encoding.ASCII.GetBytes($"GET /plaintext HTTP/1.1\r\nHost: soak\r\nX-Big: {new string('a', 40000)}\r\n\r\n")),
    ];

    private async Task BadInputAsync(Random random, WorkerState state)
    {
        await Task.Delay(s_pace, _stop);
        using var deadline = Deadline(s_smallTimeout);
        var token = deadline.Token;
        var (name, bytes) = s_badInputs[state.Step++ % s_badInputs.Length];
        state.Operation = $"bad input '{name}'";
        var connection = state.Connection = await ConnectAsync(_endPoint, token);
        try
        {
            await connection.SendAsync(bytes(random), token);
        }
        catch (SocketException)
        {
            // The server may answer and close before it read everything.
        }

        ResponseHead? head;
        try
        {
            head = await connection.ReadHeadAsync(token);
        }
        catch (Exception e) when (e is IOException or SocketException && !token.IsCancellationRequested)
        {
            head = null;
        }

        if (head is { } h)
        {
            if (h.StatusCode is < 400 or >= 500)
            {
                throw new SoakException("status", $"bad input '{name}' answered with {h.StatusCode}");
            }

            // A 4xx to bad input ends the connection.
            if (!await ServerClosedAsync(connection, token) && !await SkipsToEndAsync(connection, h, token))
            {
                throw new SoakException("status", $"bad input '{name}': the connection stayed open after {h.StatusCode}");
            }

            Expected($"input-{name}-{h.StatusCode}");
        }
        else
        {
            Expected($"input-{name}-closed");
        }

        state.Drop();
    }

    /// <summary>Connects with a 64 KiB buffer that never grows: large bodies stream through it, and a longer head is an error.</summary>
    private static async Task<RawHttpConnection> ConnectAsync(EndPoint endPoint, CancellationToken token) =>
        new(await ClientSocket.ConnectAsync(endPoint, token), MaxHead, MaxHead);

    /// <summary>Sends <paramref name="length"/> bytes of <see cref="Payload"/>(seed), hashing them.</summary>
    private static async Task<byte[]> SendPayloadAsync(RawHttpConnection connection, ulong seed, long length, CancellationToken token)
    {
        using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        foreach (var chunk in PayloadChunks(seed, length, hash))
        {
            await connection.SendAsync(chunk, token);
        }

        return hash.GetHashAndReset();
    }

    /// <summary>
    /// True when the server closed the connection with no further bytes. Any socket error counts as that
    /// close here: the soak counts whether a connection ended, not how (the tests insist on FIN or RST).
    /// </summary>
    private static async Task<bool> ServerClosedAsync(RawHttpConnection connection, CancellationToken token)
    {
        try
        {
            return await connection.ReadEndAsync(token);
        }
        catch (SocketException)
        {
            return true;
        }
    }

    private static async Task<bool> SkipsToEndAsync(RawHttpConnection connection, ResponseHead head, CancellationToken token)
    {
        try
        {
            await connection.ReadBodyAsync(head, null, token);
            return await ServerClosedAsync(connection, token);
        }
        catch (Exception e) when (e is IOException or SocketException)
        {
            return true;
        }
    }

    // ---- requests -----------------------------------------------------------------------------------

    private static async Task<bool> PlaintextAsync(RawHttpConnection connection, byte[] request, CancellationToken token)
    {
        await connection.SendAsync(request, token);
        var head = await ExpectStatusAsync(connection, 200, token);
        using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        await connection.ReadBodyAsync(head, hash.AppendData, token);
        CheckHash(s_helloHash, hash.GetHashAndReset(), "/plaintext body");
        return head.ConnectionClose;
    }

    private static async Task<bool> EchoAsync(RawHttpConnection connection, ulong seed, long size, CancellationToken token)
    {
        await connection.SendAsync($"POST /echo HTTP/1.1\r\nHost: soak\r\nContent-Length: {size}\r\n\r\n", token);
        // Full duplex: the server echoes while the body is still arriving.
        var send = SendPayloadAsync(connection, seed, size, token);
        try
        {
            var head = await ExpectStatusAsync(connection, 200, token);
            using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
            var received = await connection.ReadBodyAsync(head, hash.AppendData, token);
            var sent = await send;
            if (received != size)
            {
                throw new SoakException("checksum", $"/echo returned {received} bytes of {size}");
            }

            CheckHash(sent, hash.GetHashAndReset(), $"/echo of {size} bytes");
            return head.ConnectionClose;
        }
        finally
        {
            _ = send.ContinueWith(t => t.Exception, CancellationToken.None, TaskContinuationOptions.OnlyOnFaulted, TaskScheduler.Default);
        }
    }

    private static async Task<bool> UploadAsync(RawHttpConnection connection, ulong seed, long size, CancellationToken token)
    {
        await connection.SendAsync($"POST /upload HTTP/1.1\r\nHost: soak\r\nContent-Length: {size}\r\n\r\n", token);
        var sent = await SendPayloadAsync(connection, seed, size, token);
        var head = await ExpectStatusAsync(connection, 200, token);
        using var body = new MemoryStream();
        await connection.ReadBodyAsync(head, body.Write, token);
        var expected = string.Create(CultureInfo.InvariantCulture, $"{Convert.ToHexStringLower(sent)} {size}");
        var answer = Encoding.ASCII.GetString(body.ToArray());
        if (answer != expected)
        {
            throw new SoakException("checksum", $"/upload of {size} bytes: server read '{answer}', client sent '{expected}'");
        }

        return head.ConnectionClose;
    }

    private static async Task<bool> DownloadAsync(RawHttpConnection connection, ulong seed, long size, CancellationToken token)
    {
        await connection.SendAsync($"GET /download?bytes={size}&seed={seed} HTTP/1.1\r\nHost: soak\r\n\r\n", token);
        var head = await ExpectStatusAsync(connection, 200, token);
        using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        var received = await connection.ReadBodyAsync(head, hash.AppendData, token);
        if (received != size)
        {
            throw new SoakException("checksum", $"/download returned {received} bytes of {size}");
        }

        CheckHash(ExpectedHash(seed, size), hash.GetHashAndReset(), $"/download of {size} bytes");
        return head.ConnectionClose;
    }

    private static async Task<ResponseHead> ExpectStatusAsync(RawHttpConnection connection, int status, CancellationToken token)
    {
        var head = await connection.ReadHeadAsync(token) ?? throw new IOException("the server closed the connection instead of answering");
        return head.StatusCode == status ? head : throw new SoakException("status", $"status {head.StatusCode}, expected {status}");
    }

    private static byte[] ExpectedHash(ulong seed, long size)
    {
        using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        foreach (var _ in PayloadChunks(seed, size, hash))
        {
        }

        return hash.GetHashAndReset();
    }

    /// <summary>
    /// <paramref name="length"/> bytes of <see cref="Payload"/>(seed), 64 KiB at a time in one reused buffer
    /// (each piece is valid until the next is asked for), each added to <paramref name="hash"/> as it is made.
    /// </summary>
    private static IEnumerable<ReadOnlyMemory<byte>> PayloadChunks(ulong seed, long length, IncrementalHash hash)
    {
        var payload = new Payload(seed);
        var chunk = new byte[64 * 1024];
        for (var remaining = length; remaining > 0;)
        {
            var n = (int)Math.Min(chunk.Length, remaining);
            payload.Fill(chunk.AsSpan(0, n));
            hash.AppendData(chunk, 0, n);
            yield return chunk.AsMemory(0, n);
            remaining -= n;
        }
    }

    private static void CheckHash(byte[] expected, byte[] actual, string what)
    {
        if (!expected.AsSpan().SequenceEqual(actual))
        {
            throw new SoakException("checksum", $"SHA-256 mismatch on {what}");
        }
    }

    private static ulong NextSeed(Random random) => (ulong)random.NextInt64();

    // A TLS 1.2 ClientHello record, as a browser would send to an https:// URL on the plain port.
    private static byte[] TlsClientHello()
    {
        var hello = new List<byte> { 0x01, 0x00, 0x00, 0x00, 0x03, 0x03 };
        hello.AddRange(new byte[32]);
        hello.Add(0x00);
        hello.AddRange(new byte[] { 0x00, 0x04, 0x13, 0x01, 0xc0, 0x2f, 0x01, 0x00, 0x00, 0x00 });
        var length = hello.Count - 4;
        hello[1] = (byte)(length >> 16);
        hello[2] = (byte)(length >> 8);
        hello[3] = (byte)length;
        var record = new List<byte> { 0x16, 0x03, 0x01, (byte)(hello.Count >> 8), (byte)hello.Count };
        record.AddRange(hello);
        return [.. record];
    }

    // ---- counters -----------------------------------------------------------------------------------

    /// <summary>Counts a completed request of <paramref name="kind"/>, and in the measured window its latency from <paramref name="started"/>.</summary>
    private void Ok(string kind, long started)
    {
        Interlocked.Increment(ref _requests);
        _okKinds.AddOrUpdate(kind, 1, (_, n) => n + 1);
        if (Volatile.Read(ref _measuring))
        {
            var us = (long)Stopwatch.GetElapsedTime(started).TotalMicroseconds;
            _latencies.GetOrAdd(kind, static _ => new LongConcurrentHistogram(1, s_maxLatencyUs, 3))
                .RecordValue(Math.Clamp(us, 1, s_maxLatencyUs));
        }
    }

    /// <summary>
    /// Per kind of request, the latency from the start of its step (connecting, for churn) to its response
    /// read and checked, in µs to HdrHistogram's 3 significant digits. It is a closed-loop client's view on a
    /// shared CPU, so it shows queueing in the client as much as in the server: a trend to compare, not a bound.
    /// </summary>
    private SortedDictionary<string, SortedDictionary<string, long>> LatencySummary() =>
        new(_latencies.ToDictionary(k => k.Key, k => new SortedDictionary<string, long>(StringComparer.Ordinal)
        {
            ["count"] = k.Value.TotalCount,
            ["p50"] = k.Value.GetValueAtPercentile(50),
            ["p99"] = k.Value.GetValueAtPercentile(99),
            ["p99_9"] = k.Value.GetValueAtPercentile(99.9),
            ["max"] = k.Value.GetMaxValue(),
        }), StringComparer.Ordinal);

    private void Expected(string kind)
    {
        Interlocked.Increment(ref _expected);
        _expectedKinds.AddOrUpdate(kind, 1, (_, n) => n + 1);
    }

    private void Error(string kind, string message)
    {
        Interlocked.Increment(ref _errors);
        _errorKinds.AddOrUpdate(kind, 1, (_, n) => n + 1);
        if (_errorMessages.Count < 20)
        {
            _errorMessages.Enqueue(message);
            Console.Error.WriteLine($"soak client error [{kind}]: {message}");
        }
    }

    // ---- sampling -----------------------------------------------------------------------------------

    private async Task<Sample?> SampleAsync(string phase, int time)
    {
        try
        {
            using var deadline = new CancellationTokenSource(s_smallTimeout);
            using var connection = await ConnectAsync(_endPoint, deadline.Token);
            await connection.SendAsync("GET /_soak/stats HTTP/1.1\r\nHost: soak\r\n\r\n", deadline.Token);
            var head = await ExpectStatusAsync(connection, 200, deadline.Token);
            using var body = new MemoryStream();
            await connection.ReadBodyAsync(head, body.Write, deadline.Token);
            // /proc is read while the stats connection is still open, so every sample counts it alike.
            var (rss, threads) = ReadStatus(_serverPid);
            var fds = Directory.EnumerateFileSystemEntries($"/proc/{_serverPid}/fd").Count();
            using var stats = JsonDocument.Parse(body.ToArray());
            var s = stats.RootElement;
            return new Sample(phase, time, rss, fds, threads, s.GetProperty("connections").GetInt64() - 1,
                s.GetProperty("gc0").GetInt64(), s.GetProperty("gc1").GetInt64(), s.GetProperty("gc2").GetInt64(),
                s.GetProperty("induced").GetInt64(), s.GetProperty("heap_mb").GetDouble(), s.GetProperty("live_mb").GetDouble(),
                s.GetProperty("allocated_mb").GetDouble(), Interlocked.Read(ref _requests), Interlocked.Read(ref _errors),
                Interlocked.Read(ref _expected), Math.Round(Interlocked.Read(ref _bodyBytes) / (double)MiB, 1),
                s.GetProperty("requests").GetInt64(), s.GetProperty("status5xx").GetInt64(), s.GetProperty("app_exceptions").GetInt64(),
                s.GetProperty("aborted").GetInt64());
        }
        catch (Exception e) when (e is IOException or SocketException or OperationCanceledException or JsonException
            or KeyNotFoundException or InvalidDataException or SoakException or UnauthorizedAccessException)
        {
            Error("sample", $"sampling the server at {time} s failed: {e.GetType().Name}: {e.Message}");
            return null;
        }
    }

    private static (double RssMb, int Threads) ReadStatus(int pid)
    {
        double rss = 0;
        var threads = 0;
        foreach (var line in File.ReadLines($"/proc/{pid}/status"))
        {
            if (line.StartsWith("VmRSS:", StringComparison.Ordinal))
            {
                rss = long.Parse(line[6..].Replace("kB", "", StringComparison.Ordinal).Trim(), CultureInfo.InvariantCulture) / 1024.0;
            }
            else if (line.StartsWith("Threads:", StringComparison.Ordinal))
            {
                threads = int.Parse(line[8..].Trim(), CultureInfo.InvariantCulture);
            }
        }

        return (rss, threads);
    }

    private sealed class WorkerState(string name)
    {
        public string Name { get; } = name;

        public RawHttpConnection? Connection { get; set; }

        public string Operation { get; set; } = "start";

        public long Step { get; set; }

        public void Drop()
        {
            Connection?.Dispose();
            Connection = null;
        }
    }
}

/// <summary>A failure the soak counts as an error, by kind ("status", "checksum").</summary>
public sealed class SoakException(string kind, string message) : Exception(message)
{
    public string Kind { get; } = kind;
}

/// <summary>One CSV row: the server process and the client's counters at one moment.</summary>
public sealed record Sample(string Phase, int TimeS, double RssMb, int Fds, int Threads, long Connections,
    long Gc0, long Gc1, long Gc2, long Induced, double HeapMb, double LiveMb, double AllocatedMb,
    long Requests, long Errors, long Expected, double BodyMb, long ServerRequests, long Server5xx,
    long ServerAppExceptions, long ServerAborted)
{
    public const string Header = "time_s,phase,rss_mb,fds,threads,connections,gc0,gc1,gc2,induced_gc,heap_mb,live_mb,allocated_mb,"
        + "requests,errors,expected,body_mb,server_requests,server_5xx,server_app_exceptions,server_aborted";

    public string ToCsv() => string.Create(CultureInfo.InvariantCulture,
        $"{TimeS},{Phase},{RssMb:F1},{Fds},{Threads},{Connections},{Gc0},{Gc1},{Gc2},{Induced},{HeapMb:F2},{LiveMb:F2},{AllocatedMb:F1},"
        + $"{Requests},{Errors},{Expected},{BodyMb:F1},{ServerRequests},{Server5xx},{ServerAppExceptions},{ServerAborted}");
}
