using System.Buffers;
using System.Diagnostics.Metrics;
using System.Globalization;
using System.Net;
using System.Security.Cryptography;
using Microsoft.AspNetCore.Connections;

namespace Soak;

/// <summary>
/// The soak server: Kestrel on 127.0.0.1 over the Linux or the Sockets transport, serving
/// <list type="bullet">
/// <item><c>GET /plaintext</c>: "Hello, World!";</item>
/// <item><c>POST /echo</c>: the request body streamed back as it arrives (full duplex), same length;</item>
/// <item><c>POST /upload</c>: reads the body and answers "SHA256HEX LENGTH";</item>
/// <item><c>GET /download?bytes=N&amp;seed=S</c>: N bytes of <see cref="Payload"/>(S);</item>
/// <item><c>GET /_soak/stats</c>: JSON with GC counts, heap sizes and the server's own counters.
/// It runs a full blocking collection first, so <c>live_mb</c> is the managed memory still reachable.</item>
/// </list>
/// </summary>
public static class SoakServer
{
    private const int ChunkSize = 64 * 1024;
    private const long MaxDownload = 64L * 1024 * 1024;

    private static long s_requests;
    private static long s_status5xx;
    private static long s_appExceptions;
    private static long s_aborted;
    private static long s_activeConnections;
    private static long s_inducedCollections;

    public static async Task<int> RunAsync(string[] args)
    {
        string? transport = null;
        var port = 0;
        for (var i = 0; i < args.Length; i++)
        {
            switch (args[i])
            {
                case "--transport" when i + 1 < args.Length:
                    transport = args[++i];
                    break;
                case "--port" when i + 1 < args.Length && int.TryParse(args[i + 1], CultureInfo.InvariantCulture, out var p):
                    port = p;
                    i++;
                    break;
                default:
                    Console.Error.WriteLine($"error: unknown server argument '{args[i]}'");
                    return 2;
            }
        }

        if (transport is not ("linux" or "linux-uring" or "sockets"))
        {
            Console.Error.WriteLine("error: server needs --transport linux|linux-uring|sockets");
            return 2;
        }

        using var meters = ListenToKestrelConnections();
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.SetMinimumLevel(LogLevel.Warning);
        if (transport == "linux")
        {
            builder.WebHost.UseLinuxTransport();
        }
        else if (transport == "linux-uring")
        {
            builder.WebHost.UseLinuxTransport(o => o.IoBackend = Kestrel.Transport.Linux.IoBackend.IoUring);
        }
        else
        {
            builder.WebHost.UseSockets();
        }

        builder.WebHost.ConfigureKestrel(k => k.Listen(IPAddress.Loopback, port));
        var app = builder.Build();
        app.Use(CountingMiddleware);
        app.Run(HandleAsync);
        await app.StartAsync();
        var url = app.Urls.FirstOrDefault() ?? $"http://127.0.0.1:{port}";
        Console.WriteLine($"Soak: listening transport={transport} url={url} pid={Environment.ProcessId} "
            + $"gc={(System.Runtime.GCSettings.IsServerGC ? "server" : "workstation")}");
        await app.WaitForShutdownAsync();
        return 0;
    }

    // kestrel.active_connections, as Kestrel itself counts them (the same for both transports).
    private static MeterListener ListenToKestrelConnections()
    {
        var listener = new MeterListener
        {
            InstrumentPublished = (instrument, l) =>
            {
                if (instrument.Meter.Name == "Microsoft.AspNetCore.Server.Kestrel" && instrument.Name == "kestrel.active_connections")
                {
                    l.EnableMeasurementEvents(instrument);
                }
            },
        };
        listener.SetMeasurementEventCallback<long>((_, value, _, _) => Interlocked.Add(ref s_activeConnections, value));
        listener.Start();
        return listener;
    }

    // Counts what a client could see as a server fault: a 5xx status, or an exception that Kestrel
    // would turn into a 500. A request whose connection is gone (the client reset it: the transport
    // reports ConnectionResetException, or Kestrel aborted the request) is counted as aborted and its
    // connection aborted, as a well-behaved app does; a malformed request body (BadHttpRequestException)
    // is answered with its status (400), as Kestrel would, without logging it as an app failure.
    private static async Task CountingMiddleware(HttpContext context, RequestDelegate next)
    {
        Interlocked.Increment(ref s_requests);
        try
        {
            await next(context);
        }
        catch (BadHttpRequestException e) when (!context.Response.HasStarted)
        {
            context.Response.Clear();
            context.Response.StatusCode = e.StatusCode;
            context.Response.ContentLength = 0;
            return;
        }
        catch (Exception e) when (context.RequestAborted.IsCancellationRequested
            || e is ConnectionResetException or ConnectionAbortedException or BadHttpRequestException)
        {
            Interlocked.Increment(ref s_aborted);
            context.Abort();
            return;
        }
        catch (Exception e)
        {
            Interlocked.Increment(ref s_appExceptions);
            Interlocked.Increment(ref s_status5xx);
            Console.Error.WriteLine($"soak server: unexpected {e.GetType().Name} on {context.Request.Path}: {e.Message}");
            throw;
        }

        if (context.Response.StatusCode >= 500)
        {
            Interlocked.Increment(ref s_status5xx);
        }
    }

    private static Task HandleAsync(HttpContext context)
    {
        var path = context.Request.Path.Value;
        return path switch
        {
            "/plaintext" => PlaintextAsync(context.Response),
            "/echo" => EchoAsync(context),
            "/upload" => UploadAsync(context),
            "/download" => DownloadAsync(context),
            "/_soak/stats" => StatsAsync(context.Response),
            _ => NotFound(context.Response),
        };
    }

    private static Task NotFound(HttpResponse response)
    {
        response.StatusCode = StatusCodes.Status404NotFound;
        response.ContentLength = 0;
        return Task.CompletedTask;
    }

    private static Task PlaintextAsync(HttpResponse response)
    {
        var body = "Hello, World!"u8;
        response.ContentType = "text/plain";
        response.ContentLength = body.Length;
        response.BodyWriter.Write(body);
        return Task.CompletedTask;
    }

    private static async Task EchoAsync(HttpContext context)
    {
        if (context.Request.ContentLength is not long length)
        {
            context.Response.StatusCode = StatusCodes.Status411LengthRequired;
            context.Response.ContentLength = 0;
            return;
        }

        var aborted = context.RequestAborted;
        context.Response.ContentType = "application/octet-stream";
        context.Response.ContentLength = length;
        var reader = context.Request.BodyReader;
        var writer = context.Response.BodyWriter;
        while (true)
        {
            var result = await reader.ReadAsync(aborted);
            foreach (var segment in result.Buffer)
            {
                writer.Write(segment.Span);
            }

            reader.AdvanceTo(result.Buffer.End);
            var flush = await writer.FlushAsync(aborted);
            if (flush.IsCompleted || flush.IsCanceled)
            {
                Interlocked.Increment(ref s_aborted);
                context.Abort();
                break;
            }

            if (result.IsCompleted)
            {
                break;
            }
        }
    }

    private static async Task UploadAsync(HttpContext context)
    {
        using var hash = IncrementalHash.CreateHash(HashAlgorithmName.SHA256);
        var reader = context.Request.BodyReader;
        long length = 0;
        while (true)
        {
            var result = await reader.ReadAsync(context.RequestAborted);
            foreach (var segment in result.Buffer)
            {
                hash.AppendData(segment.Span);
                length += segment.Length;
            }

            reader.AdvanceTo(result.Buffer.End);
            if (result.IsCompleted)
            {
                break;
            }
        }

        var body = $"{Convert.ToHexStringLower(hash.GetHashAndReset())} {length.ToString(CultureInfo.InvariantCulture)}";
        context.Response.ContentType = "text/plain";
        context.Response.ContentLength = body.Length;
        await context.Response.WriteAsync(body, context.RequestAborted);
    }

    private static async Task DownloadAsync(HttpContext context)
    {
        var query = context.Request.Query;
        if (!long.TryParse(query["bytes"], NumberStyles.None, CultureInfo.InvariantCulture, out var bytes)
            || bytes > MaxDownload
            || !ulong.TryParse(query["seed"], NumberStyles.None, CultureInfo.InvariantCulture, out var seed))
        {
            context.Response.StatusCode = StatusCodes.Status400BadRequest;
            context.Response.ContentLength = 0;
            return;
        }

        var aborted = context.RequestAborted;
        context.Response.ContentType = "application/octet-stream";
        context.Response.ContentLength = bytes;
        var payload = new Payload(seed);
        var writer = context.Response.BodyWriter;
        var chunk = ArrayPool<byte>.Shared.Rent(ChunkSize);
        try
        {
            for (var remaining = bytes; remaining > 0 && !aborted.IsCancellationRequested;)
            {
                var n = (int)Math.Min(ChunkSize, remaining);
                payload.Fill(chunk.AsSpan(0, n));
                writer.Write(chunk.AsSpan(0, n));
                remaining -= n;
                var flush = await writer.FlushAsync(aborted);
                if (flush.IsCompleted || flush.IsCanceled)
                {
                    // The client is gone: end the connection rather than the response.
                    Interlocked.Increment(ref s_aborted);
                    context.Abort();
                    break;
                }
            }
        }
        finally
        {
            ArrayPool<byte>.Shared.Return(chunk);
        }
    }

    private static async Task StatsAsync(HttpResponse response)
    {
        // Sampled every 10 s by the client: the blocking full collection makes live_mb the memory that
        // is still reachable, which is what a leak grows. It adds one to gc0, gc1 and gc2 each time
        // (counted in "induced").
        var heapBefore = GC.GetGCMemoryInfo().HeapSizeBytes;
        var live = GC.GetTotalMemory(forceFullCollection: true);
        var induced = Interlocked.Increment(ref s_inducedCollections);
        var c = CultureInfo.InvariantCulture;
        var json = string.Create(c,
            $"{{\"gc0\":{GC.CollectionCount(0)},\"gc1\":{GC.CollectionCount(1)},\"gc2\":{GC.CollectionCount(2)},"
            + $"\"induced\":{induced},\"heap_mb\":{heapBefore / 1048576.0:F2},\"live_mb\":{live / 1048576.0:F2},"
            + $"\"allocated_mb\":{GC.GetTotalAllocatedBytes() / 1048576.0:F1},\"requests\":{Interlocked.Read(ref s_requests)},"
            + $"\"status5xx\":{Interlocked.Read(ref s_status5xx)},\"app_exceptions\":{Interlocked.Read(ref s_appExceptions)},"
            + $"\"aborted\":{Interlocked.Read(ref s_aborted)},\"connections\":{Interlocked.Read(ref s_activeConnections)}}}");
        response.ContentType = "application/json";
        response.ContentLength = System.Text.Encoding.UTF8.GetByteCount(json);
        await response.WriteAsync(json);
    }
}
