using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Options;
using Kestrel.Transport.Linux.Internal;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>Options come from the Kestrel:LinuxTransport section (appsettings.json, environment variables), then from code.</summary>
public sealed class ConfigurationTests
{
    [Fact]
    public void Options_bind_from_the_configuration_section_and_code_runs_after_it()
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Configuration.AddInMemoryCollection(new Dictionary<string, string?>
        {
            ["Kestrel:LinuxTransport:ThreadCount"] = "3",
            ["Kestrel:LinuxTransport:ApplicationSchedulingMode"] = "Inline",
            ["Kestrel:LinuxTransport:AioReceive"] = "true",
            ["Kestrel:LinuxTransport:DeferSend"] = "false",
            ["Kestrel:LinuxTransport:OneShotRegistrations"] = "true",
            ["Kestrel:LinuxTransport:SpinBeforeSleepMicroseconds"] = "50",
            ["Kestrel:LinuxTransport:MaxReadBufferSize"] = "4096",
            ["Kestrel:LinuxTransport:Backlog"] = "100",
        });
        builder.WebHost.UseLinuxTransport(o => o.Backlog = 200);

        using var app = builder.Build();
        var options = app.Services.GetRequiredService<IOptions<LinuxTransportOptions>>().Value;

        Assert.Equal(3, options.ThreadCount);
        Assert.Equal(ApplicationSchedulingMode.Inline, options.ApplicationSchedulingMode);
        Assert.True(options.AioReceive);
        Assert.False(options.AioSend);
        Assert.False(options.DeferSend);
        Assert.True(options.OneShotRegistrations);
        Assert.Equal(50, options.SpinBeforeSleepMicroseconds);
        Assert.Equal(4096, options.MaxReadBufferSize);
        Assert.Equal(200, options.Backlog);
        Assert.IsType<LinuxTransportFactory>(app.Services.GetServices<IConnectionListenerFactory>().Last());
    }

    [Fact]
    public void An_invalid_configured_value_fails_with_a_message_naming_the_option()
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Configuration.AddInMemoryCollection(new Dictionary<string, string?> { ["Kestrel:LinuxTransport:Backlog"] = "0" });
        builder.WebHost.UseLinuxTransport();

        // WebApplication resolves Kestrel, and so the transport factory, while it is built: that is where it fails.
        var error = Assert.Throws<OptionsValidationException>(() => builder.Build());
        Assert.Contains("LinuxTransportOptions.Backlog", error.Message, StringComparison.Ordinal);
    }
}
