using System.Collections.Concurrent;
using System.Diagnostics;

namespace TechEmpower.Tests.Infrastructure;

/// <summary>
/// The built sample running as a child process (<c>dotnet TechEmpower.dll ...</c>), with its output
/// captured. Started, it waits for the startup line the sample prints once Kestrel is listening, and
/// reads the bound URLs from it. Disposal kills the whole process tree.
/// </summary>
public sealed class SampleProcess : IAsyncDisposable
{
    /// <summary>How the sample's startup line begins.</summary>
    public const string StartupPrefix = "TechEmpower: ";

    private const string UrlsField = " urls=";

    private readonly Process _process;
    private readonly ConcurrentQueue<string> _output = new();
    private readonly TaskCompletionSource<string> _startupLine = new(TaskCreationOptions.RunContinuationsAsynchronously);
    private int _disposed;

    private SampleProcess(Process process) => _process = process;

    /// <summary>The startup line, once <see cref="StartAsync"/> returned.</summary>
    public string StartupLine => _startupLine.Task.IsCompletedSuccessfully ? _startupLine.Task.Result : "";

    /// <summary>The URLs the sample says it listens on, with real ports.</summary>
    public IReadOnlyList<string> Urls
    {
        get
        {
            var line = StartupLine;
            var at = line.IndexOf(UrlsField, StringComparison.Ordinal);
            return at < 0 ? [] : line[(at + UrlsField.Length)..].Split(", ", StringSplitOptions.RemoveEmptyEntries);
        }
    }

    /// <summary>Everything the sample wrote so far, stdout and stderr interleaved, for failure messages.</summary>
    public string Output => string.Join(Environment.NewLine, _output);

    /// <summary>Whether the process has ended.</summary>
    public bool HasExited => _process.HasExited;

    /// <summary>The sample's process id (a launcher execs the sample, so the id stays the same), for <c>/proc/PID</c>.</summary>
    public int Id => _process.Id;

    /// <summary>Starts the sample and waits until it prints its startup line.</summary>
    /// <param name="arguments">The sample's arguments.</param>
    /// <param name="environment">Variables to set (a null value removes one) on top of this process's environment.</param>
    /// <param name="launcher">A program and its arguments to run the sample under, which must exec its command (for example
    /// <c>deny_io_uring EPERM --</c>); none by default.</param>
    /// <returns>The running sample.</returns>
    public static async Task<SampleProcess> StartAsync(
        IEnumerable<string> arguments, IReadOnlyDictionary<string, string?>? environment = null, IReadOnlyList<string>? launcher = null)
    {
        var sample = new SampleProcess(Launch(arguments, environment, launcher));
        sample._process.OutputDataReceived += (_, e) => sample.OnLine(e.Data);
        sample._process.ErrorDataReceived += (_, e) => sample.OnLine(e.Data, isError: true);
        sample._process.Exited += (_, _) => _ = Task.Run(sample.OnExited);
        sample._process.EnableRaisingEvents = true;

        try
        {
            sample._process.Start();
            sample._process.BeginOutputReadLine();
            sample._process.BeginErrorReadLine();
            await sample._startupLine.Task.WaitAsync(TestTimeouts.Startup);
            return sample;
        }
        catch (TimeoutException)
        {
            await sample.DisposeAsync();
            throw new TimeoutException(
                $"The sample printed no startup line within {TestTimeouts.Startup}. Output:{Environment.NewLine}{sample.Output}");
        }
        catch
        {
            await sample.DisposeAsync();
            throw;
        }
    }

    /// <summary>Runs the sample to its exit, for command lines that must fail.</summary>
    /// <param name="arguments">The sample's arguments.</param>
    /// <param name="environment">Variables to set (a null value removes one).</param>
    /// <param name="launcher">A program and its arguments to run the sample under, as for <see cref="StartAsync"/>.</param>
    /// <returns>The exit code and everything the sample wrote.</returns>
    public static async Task<(int ExitCode, string Output)> RunToExitAsync(
        IEnumerable<string> arguments, IReadOnlyDictionary<string, string?>? environment = null, IReadOnlyList<string>? launcher = null)
    {
        using var process = Launch(arguments, environment, launcher);
        process.Start();
        var stdout = process.StandardOutput.ReadToEndAsync();
        var stderr = process.StandardError.ReadToEndAsync();
        try
        {
            await process.WaitForExitAsync().WaitAsync(TestTimeouts.Startup);
        }
        catch (TimeoutException)
        {
            process.Kill(entireProcessTree: true);
            await process.WaitForExitAsync().WaitAsync(TestTimeouts.Exit);
            throw new TimeoutException(
                $"The sample did not exit within {TestTimeouts.Startup}. Output:{Environment.NewLine}{await stdout}{await stderr}");
        }

        return (process.ExitCode, await stdout + await stderr);
    }

    /// <inheritdoc />
    public async ValueTask DisposeAsync()
    {
        if (Interlocked.Exchange(ref _disposed, 1) != 0)
        {
            return;
        }

        try
        {
            if (!_process.HasExited)
            {
                _process.Kill(entireProcessTree: true);
            }

            await _process.WaitForExitAsync().WaitAsync(TestTimeouts.Exit);
        }
        catch (InvalidOperationException)
        {
            // Never started.
        }
        finally
        {
            _process.Dispose();
        }
    }

    private static Process Launch(
        IEnumerable<string> arguments, IReadOnlyDictionary<string, string?>? environment, IReadOnlyList<string>? launcher)
    {
        var start = new ProcessStartInfo(launcher is { Count: > 0 } ? launcher[0] : SampleLocation.DotnetHost)
        {
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            RedirectStandardInput = false,
            UseShellExecute = false,
            WorkingDirectory = Path.GetDirectoryName(SampleLocation.Assembly)!,
        };
        if (launcher is { Count: > 0 })
        {
            foreach (var argument in launcher.Skip(1))
            {
                start.ArgumentList.Add(argument);
            }

            start.ArgumentList.Add(SampleLocation.DotnetHost);
        }

        start.ArgumentList.Add(SampleLocation.Assembly);
        foreach (var argument in arguments)
        {
            start.ArgumentList.Add(argument);
        }

        // The host would take these over the sample's --urls.
        start.Environment.Remove("ASPNETCORE_URLS");
        start.Environment.Remove("DOTNET_URLS");
        start.Environment.Remove("ASPNETCORE_HTTP_PORTS");
        start.Environment.Remove("ASPNETCORE_HTTPS_PORTS");
        start.Environment["DOTNET_CLI_TELEMETRY_OPTOUT"] = "1";
        foreach (var (name, value) in environment ?? new Dictionary<string, string?>())
        {
            if (value is null)
            {
                start.Environment.Remove(name);
            }
            else
            {
                start.Environment[name] = value;
            }
        }

        return new Process { StartInfo = start };
    }

    private void OnLine(string? line, bool isError = false)
    {
        if (line is null)
        {
            return;
        }

        _output.Enqueue(isError ? $"[stderr] {line}" : line);
        if (!isError && line.StartsWith(StartupPrefix, StringComparison.Ordinal))
        {
            _startupLine.TrySetResult(line);
        }
    }

    private void OnExited()
    {
        try
        {
            // Let the output readers drain, so the message carries the sample's last words.
            _process.WaitForExit(TimeSpan.FromSeconds(2));
        }
        catch (InvalidOperationException)
        {
            // Disposed meanwhile (ObjectDisposedException is one).
        }

        _startupLine.TrySetException(new InvalidOperationException(
            $"The sample exited with code {ExitCodeOrNull()} before its startup line. Output:{Environment.NewLine}{Output}"));
    }

    private string ExitCodeOrNull()
    {
        try
        {
            return _process.ExitCode.ToString(System.Globalization.CultureInfo.InvariantCulture);
        }
        catch (InvalidOperationException)
        {
            return "?";
        }
    }
}
