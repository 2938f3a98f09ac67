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
    [InlineData("MaxBytesPerRead", 2047)]
    [InlineData("MaxBytesPerRead", 1048577)]
    [InlineData("TcpDeferAcceptSeconds", -1)]
    [InlineData("TcpDeferAcceptSeconds", 3601)]
    [InlineData("BusyPollMicroseconds", -1)]
    [InlineData("BusyPollMicroseconds", 1_000_001)]
    [InlineData("SpinBeforeSleepMicroseconds", -1)]
    [InlineData("SpinBeforeSleepMicroseconds", 1_000_001)]
    [InlineData("TcpNotSentLowAtBytes", -1)]
    [InlineData("ZeroCopySendThreshold", -1)]
    [InlineData("ZeroCopySendThreshold", 1)]
    [InlineData("ZeroCopySendThreshold", 1023)]
    public void Out_of_range_socket_options_are_refused_with_the_option_named(string option, int value)
    {
        var options = new LinuxTransportOptions();
        typeof(LinuxTransportOptions).GetProperty(option)!.SetValue(options, value);
        var error = Assert.Single(options.Validate());
        Assert.Contains(option, error, StringComparison.Ordinal);
        Assert.Contains(value.ToString(System.Globalization.CultureInfo.InvariantCulture), error, StringComparison.Ordinal);
    }

    /// <summary>Either alone is valid; together a one-shot registration would miss zero-copy completions.</summary>
    [Fact]
    public void OneShotRegistrations_with_zero_copy_sends_is_refused_with_both_options_named()
    {
        Assert.Empty(new LinuxTransportOptions { OneShotRegistrations = true }.Validate());
        Assert.Empty(new LinuxTransportOptions { ZeroCopySendThreshold = 16384 }.Validate());
        var error = Assert.Single(new LinuxTransportOptions { OneShotRegistrations = true, ZeroCopySendThreshold = 16384 }.Validate());
        Assert.Contains("OneShotRegistrations", error, StringComparison.Ordinal);
        Assert.Contains("ZeroCopySendThreshold", error, StringComparison.Ordinal);
    }
}
