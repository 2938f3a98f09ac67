using System.Collections.Concurrent;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Faults;

/// <summary>An app that throws on the loop thread (Inline scheduling) costs one request, not the loop.</summary>
public sealed class InlineExceptionTests(ITestOutputHelper output)
{
    private const int Throws = 10;

    /// <summary>Inline is the mode in which the app runs on the loop thread; Sockets proves the expectation.</summary>
    public static TheoryData<TransportKind> Kinds => new() { TransportKind.Sockets, TransportKind.LinuxInline, TransportKind.LinuxIoUringInline };

    /// <summary>
    /// Proves that with one loop (ThreadCount = 1) and Inline scheduling, an exception thrown synchronously by
    /// middleware gets its request a 500, an exception thrown after the response started closes that
    /// connection, and the same loop thread goes on serving an idle keep-alive connection and new ones; the
    /// transport logs no fault of its own.
    /// </summary>
    /// <remarks>
    /// Kestrel starts each new connection on the thread pool, so a connection's first request runs there when
    /// its bytes are already in when Kestrel first reads, and on the loop thread when that read has to wait. The
    /// clients therefore pause after connecting, and the test requires the loop thread where it is certain: for
    /// some throws, and for the idle connection's request after them (its read had long been waiting).
    /// </remarks>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task An_app_exception_on_the_loop_thread_costs_one_request_and_the_same_loop_serves_on(TransportKind kind)
    {
        var logs = new LogRecorder();
        var threads = new ConcurrentBag<(string Path, int Id, string? Name)>();
        await using var host = await TestHost.StartAsync(
            kind,
            output,
            context =>
            {
                var path = context.Request.Path.Value!;
                threads.Add((path, Environment.CurrentManagedThreadId, Thread.CurrentThread.Name));
                return path switch
                {
                    "/throw" => throw new InvalidOperationException("Thrown synchronously by the app, on purpose."),
                    "/throw-after-start" => ThrowAfterStartAsync(context),
                    _ => RespondAsync(context, "ok"),
                };
            },
            s =>
            {
                s.Builder = logs.AddTo;
                s.Linux = o => o.ThreadCount = 1;
            });

        using var idle = await LeanConnection.ConnectAsync(host.EndPoint);
        await idle.SendAsync(RawHttpRequest.Bytes("GET", "/ok"), TestTimeouts.Large);
        Assert.Equal((200, "ok"), await idle.ReadStatusAndBodyAsync(TestTimeouts.Default));

        for (var i = 0; i < Throws; i++)
        {
            using (var thrower = await LeanConnection.ConnectAsync(host.EndPoint))
            {
                await Task.Delay(20);
                await thrower.SendAsync(RawHttpRequest.Bytes("GET", "/throw"), TestTimeouts.Large);
                Assert.Equal((500, ""), await thrower.ReadStatusAndBodyAsync(TestTimeouts.Default));
            }

            using (var thrower = await LeanConnection.ConnectAsync(host.EndPoint))
            {
                await Task.Delay(20);
                await thrower.SendAsync(RawHttpRequest.Bytes("GET", "/throw-after-start"), TestTimeouts.Large);
                var cut = await Record.ExceptionAsync(() => thrower.ReadStatusAndBodyAsync(TestTimeouts.Default));
                Assert.True(
                    cut is EndOfStreamException || (cut is SocketException s && s.SocketErrorCode == SocketError.ConnectionReset),
                    $"A response whose app threw after it started must be cut off by closing the connection; the client saw: {cut?.ToString() ?? "a complete response"}");
            }
        }

        await idle.SendAsync(RawHttpRequest.Bytes("GET", "/ok-after-throws"), TestTimeouts.Large);
        Assert.Equal((200, "ok"), await idle.ReadStatusAndBodyAsync(TestTimeouts.Default));
        for (var i = 0; i < 20; i++)
        {
            using var fresh = await LeanConnection.ConnectAsync(host.EndPoint);
            await fresh.SendAsync(RawHttpRequest.Bytes("GET", "/ok"), TestTimeouts.Large);
            Assert.Equal((200, "ok"), await fresh.ReadStatusAndBodyAsync(TestTimeouts.Default));
        }

        var seen = threads.ToArray();
        var onLoop = seen.Where(t => t.Name == "Kestrel Linux loop 0").ToArray();
        output.WriteLine($"Requests run on the loop thread: {string.Join(", ", onLoop.GroupBy(t => t.Path).Select(g => $"{g.Key} {g.Count()}"))}; elsewhere: {string.Join(", ", seen.Except(onLoop).GroupBy(t => t.Path).Select(g => $"{g.Key} {g.Count()}"))}.");
        if (kind.IsLinux())
        {
            // The exceptions were thrown on the loop thread, and that same thread served on after them.
            Assert.Contains(onLoop, t => t.Path == "/throw");
            Assert.Contains(onLoop, t => t.Path == "/throw-after-start");
            Assert.Contains(onLoop, t => t.Path == "/ok-after-throws");
            Assert.Single(onLoop.Select(t => t.Id).Distinct());
        }

        // Kestrel reports the app's exceptions (that is expected); nothing else may log an error.
        var others = logs.Entries.Where(e => !e.Contains("An unhandled exception was thrown by the application", StringComparison.Ordinal)).ToList();
        Assert.True(others.Count == 0, $"Errors other than the app's own exceptions were logged:{Environment.NewLine}{string.Join(Environment.NewLine, others.Take(5))}");
        Assert.Equal(2 * Throws, logs.Entries.Count);
        await host.StopAsync();
    }

    private static Task RespondAsync(HttpContext context, string body)
    {
        context.Response.ContentLength = body.Length;
        return context.Response.WriteAsync(body);
    }

    private static async Task ThrowAfterStartAsync(HttpContext context)
    {
        context.Response.ContentLength = 1000;
        await context.Response.WriteAsync("partial");
        throw new InvalidOperationException("Thrown by the app after its response started, on purpose.");
    }
}
