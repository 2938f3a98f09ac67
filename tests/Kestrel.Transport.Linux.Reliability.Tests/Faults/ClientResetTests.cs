using System.Collections.Concurrent;
using System.Globalization;
using System.Net.Sockets;
using System.Runtime.CompilerServices;
using Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Reliability.Tests.Faults;

/// <summary>A client that resets its connection in the middle of a transfer costs the server that connection and nothing else.</summary>
public sealed class ClientResetTests(ITestOutputHelper output)
{
    private const int Resets = 8;
    private const long DeclaredBodyLength = 16 * ProcessMemory.MiB;
    private const int SentBodyLength = 1024 * 1024;
    private const long ResponseLength = 64 * ProcessMemory.MiB;
    private const int ReadBeforeReset = 1024 * 1024;
    private const long BystanderLength = 32 * ProcessMemory.MiB;
    private const ulong Seed = 7;

    public static TheoryData<TransportKind> Kinds => ReliabilityTransports.Engines;

    /// <summary>
    /// Proves that a client which sends SO_LINGER 0 + close (RST) half-way through a request body fails only
    /// that request's body read (and logs no error), while a 32 MiB download on another connection completes intact, an idle
    /// keep-alive connection and new connections are still served, and every pool block comes back.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_client_reset_in_the_middle_of_a_request_body_ends_that_request_only(TransportKind kind)
    {
        var halfway = new ConcurrentDictionary<int, TaskCompletionSource>();
        var ended = new ConcurrentDictionary<int, TaskCompletionSource<string>>();
        var logs = new LogRecorder();
        await using var host = await StartAsync(kind, logs, async context =>
        {
            var index = int.Parse(context.Request.Path.Value!.Split('/')[2], CultureInfo.InvariantCulture);
            var buffer = new byte[64 * 1024];
            long read = 0;
            try
            {
                int n;
                while ((n = await context.Request.Body.ReadAsync(buffer)) > 0)
                {
                    read += n;
                    if (read >= SentBodyLength / 2)
                    {
                        halfway[index].TrySetResult();
                    }
                }

                ended[index].TrySetResult($"completed after {read} bytes");
            }
            catch (Exception e) when (e is IOException or OperationCanceledException or BadHttpRequestException)
            {
                ended[index].TrySetResult("failed: " + e.GetType().Name);
            }
        });

        await AssertServesOthersThroughAsync(host, logs, async () =>
        {
            for (var i = 0; i < Resets; i++)
            {
                halfway[i] = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
                ended[i] = new TaskCompletionSource<string>(TaskCreationOptions.RunContinuationsAsynchronously);
                var client = await TestSockets.ConnectAsync(host.EndPoint);
                await client.SendAllAsync(RawHttpRequest.Bytes("POST", $"/upload/{i}", $"Content-Length: {DeclaredBodyLength}\r\n"));
                await client.SendAllAsync(TestData.Create(Seed, SentBodyLength));
                await halfway[i].Task.WaitAsync(TestTimeouts.Default);
                Reset(client);
                var outcome = await ended[i].Task.WaitAsync(TestTimeouts.Default);
                Assert.StartsWith("failed: ", outcome, StringComparison.Ordinal);
                output.WriteLine($"Reset {i}: the body read {outcome}.");
            }
        },
        // Kestrel's own complaint when it drains the body of a request whose app caught the read's exception
        // (event 67); Kestrel logs it over its Sockets transport too.
        expectedErrors: e => e.Contains("Microsoft.AspNetCore.Server.Kestrel[67]", StringComparison.Ordinal));
    }

    /// <summary>
    /// Proves that a client which resets (RST) after reading 1 MiB of a 64 MiB response ends only that response:
    /// the app's write fails or its RequestAborted fires (and no error is logged), while a 32 MiB download on another connection
    /// completes intact, idle and new connections are still served, and every pool block comes back.
    /// </summary>
    [Theory]
    [MemberData(nameof(Kinds))]
    public async Task A_client_reset_in_the_middle_of_a_large_response_ends_that_response_only(TransportKind kind)
    {
        var ended = new ConcurrentDictionary<int, TaskCompletionSource<string>>();
        var logs = new LogRecorder();
        await using var host = await StartAsync(kind, logs, async context =>
        {
            var index = int.Parse(context.Request.Path.Value!.Split('/')[2], CultureInfo.InvariantCulture);
            var written = new StrongBox<long>();
            try
            {
                await GeneratedBody.WriteResponseAsync(context, Seed, ResponseLength, written);

                // Once the connection is gone Kestrel discards response writes without failing them, and it
                // signals RequestAborted from a thread-pool work item. On a starved machine the remaining writes
                // can all "complete" before that item runs, on every transport; the abort must still reach the
                // app, so wait for it rather than sample it.
                try
                {
                    await Task.Delay(TestTimeouts.Default, context.RequestAborted);
                    ended[index].TrySetResult($"completed after {written.Value} bytes, and RequestAborted never fired");
                }
                catch (OperationCanceledException)
                {
                    ended[index].TrySetResult($"aborted after {written.Value} bytes (discarded), RequestAborted fired after the writes");
                }
            }
            catch (Exception e) when (e is IOException or OperationCanceledException)
            {
                ended[index].TrySetResult($"aborted after {written.Value} bytes: {e.GetType().Name}");
            }
        });

        await AssertServesOthersThroughAsync(host, logs, async () =>
        {
            for (var i = 0; i < Resets; i++)
            {
                ended[i] = new TaskCompletionSource<string>(TaskCreationOptions.RunContinuationsAsynchronously);
                var client = await TestSockets.ConnectAsync(host.EndPoint);
                await client.SendAllAsync(RawHttpRequest.Bytes("GET", $"/big/{i}"));
                await client.ReceiveExactlyAsync(new byte[ReadBeforeReset]);
                Reset(client);
                // Longer than the handler's own wait for RequestAborted, so that a missing abort is reported as such.
                var outcome = await ended[i].Task.WaitAsync(TestTimeouts.Large);
                Assert.StartsWith("aborted ", outcome, StringComparison.Ordinal);
                output.WriteLine($"Reset {i}: the response was {outcome}.");
            }
        });
    }

    private Task<TestHost> StartAsync(TransportKind kind, LogRecorder logs, RequestDelegate faulted)
        => TestHost.StartAsync(kind, output, context =>
        {
            var path = context.Request.Path.Value!;
            if (path.StartsWith("/bystander", StringComparison.Ordinal))
            {
                return GeneratedBody.WriteResponseAsync(context, Seed, BystanderLength);
            }

            if (path.StartsWith("/ping", StringComparison.Ordinal))
            {
                context.Response.ContentLength = 4;
                return context.Response.WriteAsync("pong");
            }

            return faulted(context);
        },
        s => s.Builder = logs.AddTo);

    /// <summary>Runs the resets while a download is in progress and an idle connection waits, then checks both and new connections.</summary>
    private static async Task AssertServesOthersThroughAsync(TestHost host, LogRecorder logs, Func<Task> resets, Func<string, bool>? expectedErrors = null)
    {
        using var idle = await LeanConnection.ConnectAsync(host.EndPoint);
        await idle.SendAsync(RawHttpRequest.Bytes("GET", "/ping"), TestTimeouts.Large);
        Assert.Equal((200, "pong"), await idle.ReadStatusAndBodyAsync(TestTimeouts.Default));

        using var bystander = await TestSockets.ConnectAsync(host.EndPoint);
        await bystander.SendAllAsync(RawHttpRequest.Bytes("GET", "/bystander"));
        var download = GeneratedBody.ReadResponseHashedAsync(bystander, TestTimeouts.Large);

        // When resets() fails, the download is never awaited; mark its fault observed so that it cannot
        // surface later as an unobserved task exception in another test's check.
        _ = download.ContinueWith(static t => t.Exception, TaskContinuationOptions.OnlyOnFaulted | TaskContinuationOptions.ExecuteSynchronously);
        await resets();

        Assert.Equal((200, BystanderLength, TestData.Sha256(Seed, BystanderLength)), await download);
        await idle.SendAsync(RawHttpRequest.Bytes("GET", "/ping"), TestTimeouts.Large);
        Assert.Equal((200, "pong"), await idle.ReadStatusAndBodyAsync(TestTimeouts.Default));
        await Task.WhenAll(Enumerable.Range(0, 16).Select(async _ =>
        {
            using var fresh = await LeanConnection.ConnectAsync(host.EndPoint);
            await fresh.SendAsync(RawHttpRequest.Bytes("GET", "/ping"), TestTimeouts.Large);
            Assert.Equal((200, "pong"), await fresh.ReadStatusAndBodyAsync(TestTimeouts.Default));
        }));

        await host.StopAsync();

        // A reset is the client's business: the app handled it, so nothing may log an error about it.
        logs.AssertNone("Client resets", expectedErrors);
    }

    private static void Reset(Socket client)
    {
        client.LingerState = new LingerOption(true, 0);
        client.Dispose();
    }
}
