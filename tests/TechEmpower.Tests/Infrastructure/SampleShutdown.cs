using System.Diagnostics;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>Stops a running sample as a service manager does, with SIGTERM, so that it shuts down gracefully and says its last words.</summary>
public static class SampleShutdown
{
    /// <summary>How long the output may take to reach <see cref="SampleProcess.Output"/> after the process has ended (its readers drain the pipe).</summary>
    public static readonly TimeSpan Drain = TimeSpan.FromSeconds(3);

    /// <summary>Sends SIGTERM and waits until the process has ended and, when <paramref name="lastLine"/> is given, until a line
    /// starting with it has been read (or <see cref="Drain"/> has passed).</summary>
    /// <param name="sample">The running sample.</param>
    /// <param name="lastLine">The start of a line expected in the output after the exit, or null.</param>
    /// <returns>Everything the sample wrote.</returns>
    public static async Task<string> TerminateAsync(SampleProcess sample, string? lastLine)
    {
        ArgumentNullException.ThrowIfNull(sample);
        using (var kill = Process.Start(new ProcessStartInfo("kill", ["-TERM", sample.Id.ToString(System.Globalization.CultureInfo.InvariantCulture)])
        {
            UseShellExecute = false,
        })!)
        {
            await kill.WaitForExitAsync().WaitAsync(TestTimeouts.Exit);
            Assert.Equal(0, kill.ExitCode);
        }

        var exitDeadline = Stopwatch.GetTimestamp() + (long)(TestTimeouts.Exit.TotalSeconds * Stopwatch.Frequency);
        while (!sample.HasExited)
        {
            Assert.True(Stopwatch.GetTimestamp() < exitDeadline, $"The sample did not exit within {TestTimeouts.Exit} of SIGTERM:{Environment.NewLine}{sample.Output}");
            await Task.Delay(50);
        }

        var drainDeadline = Stopwatch.GetTimestamp() + (long)(Drain.TotalSeconds * Stopwatch.Frequency);
        while (Stopwatch.GetTimestamp() < drainDeadline && (lastLine is null || !HasLine(sample.Output, lastLine)))
        {
            await Task.Delay(50);
        }

        return sample.Output;
    }

    /// <summary>The first line of <paramref name="output"/> that starts with <paramref name="start"/>, or null.</summary>
    /// <param name="output">The output.</param>
    /// <param name="start">How the line starts.</param>
    /// <returns>The line, or null.</returns>
    public static string? Line(string output, string start) =>
        output?.Split(Environment.NewLine).FirstOrDefault(l => l.StartsWith(start, StringComparison.Ordinal));

    private static bool HasLine(string output, string start) => Line(output, start) is not null;
}
