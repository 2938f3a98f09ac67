namespace Kestrel.Transport.Linux.Reliability.Tests.Integrity;

/// <summary>
/// Appends figures worth quoting (cases per outcome, bytes verified) to artifacts/reliability/figures.txt
/// at the repository root, one line per test run, so a CI run leaves them beside its logs.
/// </summary>
internal static class FiguresFile
{
    private static readonly Lock s_gate = new();

    public static void Append(ITestOutputHelper output, string line)
    {
        var stamped = $"{DateTime.UtcNow:yyyy-MM-ddTHH:mm:ssZ} {line}";
        output.WriteLine(stamped);
        var root = FindRepositoryRoot();
        if (root is null)
        {
            output.WriteLine("(Kestrel.Transport.Linux.slnx not found above the test directory: the figure was not written to a file.)");
            return;
        }

        var directory = Path.Combine(root, "artifacts", "reliability");
        Directory.CreateDirectory(directory);
        lock (s_gate)
        {
            File.AppendAllText(Path.Combine(directory, "figures.txt"), stamped + Environment.NewLine);
        }
    }

    private static string? FindRepositoryRoot()
    {
        for (var directory = new DirectoryInfo(AppContext.BaseDirectory); directory is not null; directory = directory.Parent)
        {
            if (File.Exists(Path.Combine(directory.FullName, "Kestrel.Transport.Linux.slnx")))
            {
                return directory.FullName;
            }
        }

        return null;
    }
}
