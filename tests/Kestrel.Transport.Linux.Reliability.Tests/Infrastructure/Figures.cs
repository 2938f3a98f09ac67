using System.Globalization;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>
/// Measured figures, written to the test output and appended to artifacts/reliability/figures.txt, so
/// that reports can quote what a run measured rather than what someone remembered.
/// </summary>
internal static class Figures
{
    private static readonly Lock s_gate = new();

    public static void Report(ITestOutputHelper output, string test, TransportKind kind, FormattableString figure)
    {
        var text = FormattableString.Invariant(figure);
        output.WriteLine($"{test} [{kind}]: {text}");
        var line = string.Create(CultureInfo.InvariantCulture, $"{DateTime.UtcNow:yyyy-MM-ddTHH:mm:ssZ} {test} [{kind}]: {text}{Environment.NewLine}");
        var directory = Path.Combine(RepositoryRoot(), "artifacts", "reliability");
        lock (s_gate)
        {
            Directory.CreateDirectory(directory);
            File.AppendAllText(Path.Combine(directory, "figures.txt"), line);
        }
    }

    private static string RepositoryRoot()
    {
        for (var directory = new DirectoryInfo(AppContext.BaseDirectory); directory is not null; directory = directory.Parent)
        {
            if (File.Exists(Path.Combine(directory.FullName, "Kestrel.Transport.Linux.slnx")))
            {
                return directory.FullName;
            }
        }

        throw new InvalidOperationException($"No Kestrel.Transport.Linux.slnx above {AppContext.BaseDirectory}.");
    }
}
