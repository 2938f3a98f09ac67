using System.Diagnostics;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>How unbinding behaves when a loop cannot answer in time.</summary>
public sealed class UnbindTests(ITestOutputHelper output)
{
    /// <summary>
    /// With Inline scheduling a handler that blocks holds its loop, and the loop cannot let go of its listening
    /// socket until it returns. Kestrel's shutdown still ends when its token fires: unbinding stops waiting then, and
    /// the socket closes once the loop lets go.
    /// </summary>
    [Fact]
    public async Task A_stop_whose_token_fires_while_a_handler_holds_its_loop_ends_and_the_port_closes_once_the_loop_lets_go()
    {
        using var release = new ManualResetEventSlim();
        var entered = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await TestHost.StartAsync(
            TransportKind.LinuxInline,
            output,
            async context =>
            {
                if (context.Request.Path == "/block")
                {
                    entered.TrySetResult();
                    release.Wait(TestTimeouts.Default); // blocks the loop: Inline scheduling
                }

                await context.Response.WriteAsync("done");
            },
            settings => settings.Linux = options => options.ThreadCount = 1);

        using var client = new HttpClient { Timeout = TestTimeouts.Default };
        var blocked = client.GetStringAsync(new Uri(host.Address, "/block"));
        await entered.Task.WaitAsync(TestTimeouts.Default);

        using var shutdown = new CancellationTokenSource(TimeSpan.FromSeconds(1));
        var clock = Stopwatch.StartNew();
        await host.App.StopAsync(shutdown.Token).WaitAsync(TimeSpan.FromSeconds(15));
        output.WriteLine($"StopAsync returned after {clock.ElapsedMilliseconds} ms while the loop was held");

        // The shutdown aborted the held connection; once the loop is back the client learns of it (a reset).
        release.Set();
        await Assert.ThrowsAsync<HttpRequestException>(() => blocked.WaitAsync(TestTimeouts.Default));
        var deadline = Stopwatch.StartNew();
        while (!await TestSockets.IsRefusedAsync(host.EndPoint))
        {
            Assert.True(deadline.Elapsed < TestTimeouts.Default, "The listening socket stayed open after its loop let go.");
            await Task.Delay(50);
        }
    }
}
