using Kestrel.Transport.Linux.Hosting;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Options;

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
            ["Kestrel:LinuxTransport:IoBackend"] = "EpollAio",
            ["Kestrel:LinuxTransport:SpinBeforeSleepMicroseconds"] = "50",
            ["Kestrel:LinuxTransport:MaxReadBufferSize"] = "4096",
            ["Kestrel:LinuxTransport:Backlog"] = "100",
        });
        builder.WebHost.UseLinuxTransport(o => o.Backlog = 200);

        using var app = builder.Build();
        var options = app.Services.GetRequiredService<IOptions<LinuxTransportOptions>>().Value;

        Assert.Equal(3, options.ThreadCount);
        Assert.Equal(ApplicationSchedulingMode.Inline, options.ApplicationSchedulingMode);
        Assert.Equal(IoBackend.EpollAio, options.IoBackend);
        Assert.Equal(50, options.SpinBeforeSleepMicroseconds);
        Assert.Equal(4096, options.MaxReadBufferSize);
        Assert.Equal(200, options.Backlog);
        Assert.IsType<LinuxTransportFactory>(app.Services.GetServices<IConnectionListenerFactory>().Last());
    }

    /// <summary>
    /// The measurement switches are internal: configuration that names them (as the public options of
    /// earlier builds did) changes nothing, under the section or under its Tuning key.
    /// </summary>
    [Fact]
    public void Configuration_cannot_reach_the_internal_tuning_switches()
    {
        // Each switch set to something other than its default, under both keys configuration could use.
        var defaults = new TransportTuning();
        var settings = new Dictionary<string, string?>();
        foreach (string name in TransportTuning.Names)
        {
            object value = typeof(TransportTuning).GetProperty(name)!.GetValue(defaults)!;
            string other = value is bool flag ? (!flag).ToString() : "4096";
            settings[$"Kestrel:LinuxTransport:{name}"] = other;
            settings[$"Kestrel:LinuxTransport:Tuning:{name}"] = other;
        }

        var builder = WebApplication.CreateSlimBuilder();
        builder.Configuration.AddInMemoryCollection(settings);
        builder.WebHost.UseLinuxTransport();
        using var app = builder.Build();
        var tuning = app.Services.GetRequiredService<IOptions<LinuxTransportOptions>>().Value.Tuning;

        Assert.Equal(defaults.DeferSend, tuning.DeferSend);
        Assert.Equal(defaults.SendFromThreadPool, tuning.SendFromThreadPool);
        Assert.Equal(defaults.CoalesceThreadPoolSends, tuning.CoalesceThreadPoolSends);
        Assert.Equal(defaults.MaxBytesPerRead, tuning.MaxBytesPerRead);
        Assert.Equal(defaults.SchedBatchLoops, tuning.SchedBatchLoops);
        Assert.Equal(defaults.TcpQuickAck, tuning.TcpQuickAck);
        Assert.Equal(defaults.TcpNotSentLowAtBytes, tuning.TcpNotSentLowAtBytes);
        Assert.Equal(defaults.UseNativeEngine, tuning.UseNativeEngine);
        Assert.Equal(defaults.ZeroCopyWhenKernelCopies, tuning.ZeroCopyWhenKernelCopies);
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
