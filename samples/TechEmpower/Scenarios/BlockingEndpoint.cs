using System.Diagnostics;
using System.Globalization;

namespace TechEmpower.Scenarios;

/// <summary>
/// GET /block?ms=N&amp;how=sleep|result|lock: a handler that blocks the thread it runs on for N ms, for
/// <c>benchmarks/compare.sh --phases blocking</c>. The question is how long the other connections of the
/// same event loop wait meanwhile (issue 32); it is not a TechEmpower test, and compare.sh's verification
/// never asks for it. The answer is JSON with the block's start and end on <c>CLOCK_MONOTONIC</c> (which is
/// <see cref="Stopwatch"/>'s clock on Linux, and benchmarks/loadgen's), so the tool can tell which
/// bystander requests were sent while the handler was blocked.
/// </summary>
public static class BlockingEndpoint
{
    /// <summary>The endpoint's path.</summary>
    public const string Path = "/block";

    /// <summary>The longest block accepted, in milliseconds.</summary>
    public const int MaxMilliseconds = 60_000;

    /// <summary>Handles one request: parses <c>ms</c> and <c>how</c>, blocks, then answers.</summary>
    /// <param name="context">The request.</param>
    /// <returns>A task that completes when the answer is written.</returns>
    public static Task Handle(HttpContext context)
    {
        ArgumentNullException.ThrowIfNull(context);
        var response = context.Response;
        var query = context.Request.Query;
        string how = query["how"].ToString() is { Length: > 0 } given ? given : "sleep";
        if (!int.TryParse(query["ms"], NumberStyles.None, CultureInfo.InvariantCulture, out int ms)
            || ms is < 0 or > MaxMilliseconds || how is not ("sleep" or "result" or "lock"))
        {
            response.StatusCode = StatusCodes.Status400BadRequest;
            response.ContentType = "text/plain";
            return response.WriteAsync(
                $"expected ?ms=0..{MaxMilliseconds}&how=sleep|result|lock, got {context.Request.QueryString}");
        }

        // Synchronous on purpose, with no await before the block: it holds whichever thread runs the
        // request (a loop thread with Inline scheduling, a pool thread with ThreadPool).
        long start = Stopwatch.GetTimestamp();
        switch (how)
        {
            case "sleep":
                Thread.Sleep(ms);
                break;
            case "result":
                // Sync over async: the delay's continuation itself needs a pool thread to complete.
                _ = DelayedValueAsync(ms).Result;
                break;
            default:
                WaitForHeldLock(ms);
                break;
        }

        long end = Stopwatch.GetTimestamp();
        string body = string.Create(
            CultureInfo.InvariantCulture,
            $"{{\"how\":\"{how}\",\"ms\":{ms},\"start_ns\":{Nanoseconds(start)},\"end_ns\":{Nanoseconds(end)}}}");
        response.ContentType = "application/json";
        response.ContentLength = body.Length;
        return response.WriteAsync(body);
    }

    private static async Task<int> DelayedValueAsync(int ms)
    {
        await Task.Delay(ms).ConfigureAwait(false);
        return ms;
    }

    // Another thread takes the lock and keeps it for ms; this one then waits for it, as a request
    // does behind a long critical section.
    private static void WaitForHeldLock(int ms)
    {
        var gate = new Lock();
        using var held = new ManualResetEventSlim();
        var holder = new Thread(() =>
        {
            lock (gate)
            {
                held.Set();
                Thread.Sleep(ms);
            }
        })
        {
            IsBackground = true,
            Name = "block-lock-holder",
        };
        holder.Start();
        held.Wait();
        lock (gate)
        {
            // Acquired only once the holder let go: the wait above is the block.
        }

        holder.Join();
    }

    private static long Nanoseconds(long timestamp) =>
        (long)((Int128)timestamp * 1_000_000_000 / Stopwatch.Frequency);
}
