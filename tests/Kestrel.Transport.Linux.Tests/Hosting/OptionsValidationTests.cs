using Kestrel.Transport.Linux.Tests.Infrastructure;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// Invalid Linux transport options stop the host from starting, with the option named. Linux kinds only:
/// the options belong to the Linux transport, and Sockets has no such failure to compare with.
/// </summary>
public sealed class OptionsValidationTests(ITestOutputHelper output)
{
    [Theory]
    [MemberData(nameof(Transports.LinuxOnly), MemberType = typeof(Transports))]
    public async Task ThreadCount_0_fails_host_start_with_a_message_naming_ThreadCount(TransportKind kind)
    {
        var failure = await Assert.ThrowsAnyAsync<Exception>(async () =>
        {
            await using var host = await TestHost.StartAsync(kind, output, _ => Task.CompletedTask, s => s.Linux = o => o.ThreadCount = 0);
        });

        output.WriteLine(failure.ToString());
        Assert.Contains("ThreadCount", failure.Message, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData("Backlog", 0)]
    [InlineData("Backlog", 65536)]
    [InlineData("TcpDeferAcceptSeconds", -1)]
    [InlineData("TcpDeferAcceptSeconds", 3601)]
    [InlineData("BusyPollMicroseconds", -1)]
    [InlineData("BusyPollMicroseconds", 1_000_001)]
    [InlineData("SpinBeforeSleepMicroseconds", -1)]
    [InlineData("SpinBeforeSleepMicroseconds", 1_000_001)]
    [InlineData("ZeroCopySendThreshold", -1)]
    [InlineData("ZeroCopySendThreshold", 1)]
    [InlineData("ZeroCopySendThreshold", 1023)]
    public void Out_of_range_options_are_refused_with_the_option_named(string option, int value)
    {
        var options = new LinuxTransportOptions();
        typeof(LinuxTransportOptions).GetProperty(option)!.SetValue(options, value);
        var error = Assert.Single(options.Validate());
        Assert.Contains($"LinuxTransportOptions.{option}", error, StringComparison.Ordinal);
        Assert.Contains(value.ToString(System.Globalization.CultureInfo.InvariantCulture), error, StringComparison.Ordinal);
    }

    [Fact]
    public void An_undefined_IoBackend_is_refused_with_the_option_named()
    {
        var error = Assert.Single(new LinuxTransportOptions { IoBackend = (IoBackend)7 }.Validate());
        Assert.Contains("LinuxTransportOptions.IoBackend", error, StringComparison.Ordinal);
        Assert.Contains("7", error, StringComparison.Ordinal);
    }

    /// <summary>The internal switches that take numbers are checked too: a benchmark's typo must not run a meaningless configuration.</summary>
    [Theory]
    [InlineData("MaxBytesPerRead", 2047)]
    [InlineData("MaxBytesPerRead", 1048577)]
    [InlineData("TcpNotSentLowAtBytes", -1)]
    public void Out_of_range_tuning_values_are_refused_with_the_switch_named(string name, int value)
    {
        var options = new LinuxTransportOptions();
        Assert.Null(options.Tuning.Apply(string.Create(System.Globalization.CultureInfo.InvariantCulture, $"{name}={value}")));
        var error = Assert.Single(options.Validate());
        Assert.Contains($"TransportTuning.{name}", error, StringComparison.Ordinal);
        Assert.Contains(value.ToString(System.Globalization.CultureInfo.InvariantCulture), error, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData("DeferSend=maybe", "DeferSend")]
    [InlineData("MaxBytesPerRead=lots", "MaxBytesPerRead")]
    [InlineData("OneShotRegistrations=true", "unknown tuning switch 'OneShotRegistrations'")]
    [InlineData("DeferSend", "not Name=value")]
    public void Tuning_text_that_does_not_parse_is_refused_with_the_reason(string text, string expected)
    {
        var tuning = new Kestrel.Transport.Linux.Hosting.TransportTuning();
        var error = tuning.Apply(text);
        Assert.NotNull(error);
        Assert.Contains(expected, error, StringComparison.Ordinal);
    }

    [Fact]
    public void Tuning_text_sets_each_switch_it_names()
    {
        var tuning = new Kestrel.Transport.Linux.Hosting.TransportTuning();
        Assert.Null(tuning.Apply("SendFromThreadPool=false, MaxBytesPerRead=4096,TcpQuickAck=true"));
        Assert.False(tuning.SendFromThreadPool);
        Assert.Equal(4096, tuning.MaxBytesPerRead);
        Assert.True(tuning.TcpQuickAck);
        Assert.True(tuning.DeferSend);
    }
}
