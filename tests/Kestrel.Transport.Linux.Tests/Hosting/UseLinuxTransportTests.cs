using System.Net;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>What UseLinuxTransport() registers, how an operator sees that it is active, and how it is turned off.</summary>
public sealed class UseLinuxTransportTests
{
    private const string Category = "Kestrel.Transport.Linux";

    [Fact]
    public void Called_twice_it_registers_one_factory_and_applies_both_configurations()
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.WebHost.UseLinuxTransport(o => o.Backlog = 100);
        builder.WebHost.UseLinuxTransport(o => o.ThreadCount = 3);

        using var app = builder.Build();
        Assert.Single(app.Services.GetServices<IConnectionListenerFactory>(), f => f is LinuxTransportFactory);
        var options = app.Services.GetRequiredService<IOptions<LinuxTransportOptions>>().Value;
        Assert.Equal(100, options.Backlog);
        Assert.Equal(3, options.ThreadCount);
    }

    /// <summary>At the default level (Information), one line names the endpoints, the loops, the engine and the scheduling.</summary>
    [Fact]
    public async Task At_start_up_one_Information_line_names_the_endpoints_the_loops_and_the_engine()
    {
        var log = new LogLines();
        await using var app = await StartAsync(log, settings: [], o => o.ThreadCount = 2);
        var port = new Uri(Assert.Single(app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses)).Port;

        var serving = Assert.Single(log.Of(Category), l => l.StartsWith("Kestrel.Transport.Linux is serving", StringComparison.Ordinal));
        Assert.Equal($"Kestrel.Transport.Linux is serving 127.0.0.1:{port} on 2 event loops: epoll, native engine, Adaptive scheduling.", serving);
        Assert.Equal("Hello", await GetAsync(port));
    }

    /// <summary>The way back without a code change: Kestrel:LinuxTransport:Enabled=false leaves Kestrel on Sockets, and says so.</summary>
    [Fact]
    public async Task Enabled_false_in_configuration_leaves_Kestrel_on_its_Sockets_transport()
    {
        var log = new LogLines();
        await using var app = await StartAsync(log, settings: new() { ["Kestrel:LinuxTransport:Enabled"] = "false" });
        var port = new Uri(Assert.Single(app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses)).Port;

        Assert.DoesNotContain(app.Services.GetServices<IConnectionListenerFactory>(), f => f is LinuxTransportFactory);
        Assert.Equal("Hello", await GetAsync(port));
        Assert.Equal(
            ["UseLinuxTransport() has no effect: Kestrel:LinuxTransport:Enabled is false; its other settings are not read. Kestrel stays on the Sockets transport."],
            log.Of(Category));
    }

    /// <summary>
    /// On another operating system (taken here through the registration's own branch) the transport stays off, but an
    /// invalid option still fails start-up, naming it: a configuration error shows on a developer's machine, not first
    /// in production.
    /// </summary>
    [Fact]
    public async Task Off_Linux_invalid_options_still_fail_start_up()
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Configuration.AddInMemoryCollection(new Dictionary<string, string?> { ["Kestrel:LinuxTransport:Backlog"] = "0" });
        builder.WebHost.UseKestrel(k => k.Listen(IPAddress.Loopback, 0));
        WebHostBuilderLinuxTransportExtensions.AddLinuxTransport(builder.Services, builder.Configuration, static _ => { }, isLinux: false);
        await using var app = builder.Build();
        app.Run(static c => c.Response.WriteAsync("Hello"));

        var error = await Assert.ThrowsAsync<OptionsValidationException>(() => app.StartAsync().WaitAsync(TestTimeouts.Default));
        Assert.Contains("LinuxTransportOptions.Backlog", error.Message, StringComparison.Ordinal);
    }

    /// <summary>
    /// The way back must work whatever else the section holds: with Enabled=false an out-of-range value, and a value
    /// that does not bind at all (an engine name only a newer package knows), leave start-up alone.
    /// </summary>
    [Fact]
    public async Task Enabled_false_rolls_back_even_when_the_section_holds_values_that_would_fail_start_up()
    {
        var log = new LogLines();
        await using var app = await StartAsync(log, settings: new()
        {
            ["Kestrel:LinuxTransport:Enabled"] = "false",
            ["Kestrel:LinuxTransport:Backlog"] = "0",
            ["Kestrel:LinuxTransport:IoBackend"] = "SomethingNewer",
        });
        var port = new Uri(Assert.Single(app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses)).Port;

        Assert.DoesNotContain(app.Services.GetServices<IConnectionListenerFactory>(), f => f is LinuxTransportFactory);
        Assert.Equal("Hello", await GetAsync(port));
    }

    private static async Task<WebApplication> StartAsync(LogLines log, Dictionary<string, string?> settings, Action<LinuxTransportOptions>? configure = null)
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Configuration.AddInMemoryCollection(settings);
        builder.Logging.ClearProviders();
        builder.Logging.AddProvider(log);
        builder.WebHost.UseKestrel(k => k.Listen(IPAddress.Loopback, 0));
        builder.WebHost.UseLinuxTransport(configure ?? (static _ => { }));
        var app = builder.Build();
        app.Run(static c => c.Response.WriteAsync("Hello"));
        await app.StartAsync().WaitAsync(TestTimeouts.Default);
        return app;
    }

    private static async Task<string> GetAsync(int port)
    {
        using var client = new HttpClient { Timeout = TestTimeouts.Default };
        return await client.GetStringAsync(new Uri($"http://127.0.0.1:{port}/"));
    }
}
