using System.Net;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Hosting;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>Stopping the host lets requests in flight finish.</summary>
public sealed class ShutdownTests(ITestOutputHelper output)
{
    // Long enough that a shutdown which merely ran out the clock cannot pass for a graceful one (see below).
    private static readonly TimeSpan s_shutdownTimeout = TimeSpan.FromSeconds(20);
    private static readonly TimeSpan s_gracefulStopBound = TimeSpan.FromSeconds(10);

    [Theory]
    [MemberData(nameof(Transports.HostLevel), MemberType = typeof(Transports))]
    public async Task Graceful_shutdown_stops_accepting_and_lets_a_request_in_flight_complete(TransportKind kind)
    {
        var entered = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        var release = new TaskCompletionSource(TaskCreationOptions.RunContinuationsAsynchronously);
        await using var host = await TestHost.StartAsync(
            kind,
            output,
            async context =>
            {
                entered.TrySetResult();
                await release.Task;
                await context.Response.WriteAsync("done");
            },
            s => s.Builder = builder => builder.Services.Configure<HostOptions>(o => o.ShutdownTimeout = s_shutdownTimeout));

        using var client = new HttpClient { Timeout = TestTimeouts.Large };
        var request = client.GetAsync(new Uri(host.Address, "/slow"));
        await entered.Task.WaitAsync(TestTimeouts.Default);

        var stopping = host.BeginStop();

        // The listener goes first: new connections are refused while the request is still running.
        var deadline = DateTime.UtcNow + TestTimeouts.Default;
        while (!await TestSockets.IsRefusedAsync(host.EndPoint))
        {
            Assert.True(DateTime.UtcNow < deadline, "The server still accepted connections long after StopAsync began.");
            await Task.Delay(20);
        }

        Assert.False(stopping.IsCompleted, "StopAsync finished while a request was still in flight.");

        release.SetResult();
        using var response = await request.WaitAsync(TestTimeouts.Default);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal("done", await response.Content.ReadAsStringAsync());

        // Well inside the shutdown timeout: the server noticed the connection finish, it did not just give up on it.
        await stopping.WaitAsync(s_gracefulStopBound);
        await host.StopAsync();
    }
}
