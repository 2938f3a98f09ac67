using System.Diagnostics;
using System.Text;

namespace Kestrel.Transport.Linux.Reliability.Tests.Infrastructure;

/// <summary>
/// A client in a child python3 process, driven line by line over stdin/stdout. Used where the client's
/// sockets must not count against this process's RLIMIT_NOFILE: 10,000 connections need 10,000 server
/// descriptors here plus 10,000 client descriptors there, and the machine's hard limit is 20,000.
/// </summary>
internal sealed class PythonClient : IAsyncDisposable
{
    private readonly Process _process;
    private readonly string _scriptPath;
    private readonly StringBuilder _stderr = new();

    private PythonClient(Process process, string scriptPath)
    {
        _process = process;
        _scriptPath = scriptPath;
    }

    /// <summary>
    /// Prepended to every script: <c>read_response(s)</c> reads one HTTP/1.1 response with a
    /// Content-Length body from a blocking socket and returns (status, body).
    /// </summary>
    private const string Prelude = """
        def read_response(s):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    raise EOFError("the server closed before the response head")
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                chunk = s.recv(4096)
                if not chunk:
                    raise EOFError("the server closed in the middle of the body")
                body += chunk
            return int(lines[0].split(b" ")[1]), body

        """;

    public static PythonClient Start(string script, params string[] arguments)
    {
        var scriptPath = Path.Combine(Path.GetTempPath(), $"ktl-client-{Guid.NewGuid():N}.py");
        File.WriteAllText(scriptPath, Prelude + "\n" + script);
        var info = new ProcessStartInfo("python3")
        {
            RedirectStandardInput = true,
            RedirectStandardOutput = true,
            RedirectStandardError = true,
            UseShellExecute = false,
        };
        info.ArgumentList.Add("-u");
        info.ArgumentList.Add(scriptPath);
        foreach (var argument in arguments)
        {
            info.ArgumentList.Add(argument);
        }

        var process = Process.Start(info) ?? throw new InvalidOperationException("python3 did not start.");
        var client = new PythonClient(process, scriptPath);
        process.ErrorDataReceived += (_, e) =>
        {
            if (e.Data is not null)
            {
                lock (client._stderr)
                {
                    client._stderr.AppendLine(e.Data);
                }
            }
        };
        process.BeginErrorReadLine();
        return client;
    }

    /// <summary>The next line the child prints, within <paramref name="timeout"/>.</summary>
    public async Task<string> ReadLineAsync(TimeSpan timeout)
    {
        string? line;
        try
        {
            line = await _process.StandardOutput.ReadLineAsync().WaitAsync(timeout);
        }
        catch (TimeoutException)
        {
            throw new TimeoutException($"The python client printed nothing within {timeout}. Its stderr:{Environment.NewLine}{Stderr}");
        }

        return line ?? throw new EndOfStreamException($"The python client exited (code {ExitCode()}). Its stderr:{Environment.NewLine}{Stderr}");
    }

    /// <summary>Sends one command line and returns the child's answer line.</summary>
    public async Task<string> CommandAsync(string command, TimeSpan timeout)
    {
        await _process.StandardInput.WriteLineAsync(command);
        await _process.StandardInput.FlushAsync();
        return await ReadLineAsync(timeout);
    }

    public string Stderr
    {
        get
        {
            lock (_stderr)
            {
                return _stderr.ToString();
            }
        }
    }

    public async ValueTask DisposeAsync()
    {
        try
        {
            _process.StandardInput.Close();
            using var cts = new CancellationTokenSource(TestTimeouts.Default);
            await _process.WaitForExitAsync(cts.Token);
        }
        catch (Exception e) when (e is OperationCanceledException or IOException or InvalidOperationException)
        {
            _process.Kill(entireProcessTree: true);
        }
        finally
        {
            _process.Dispose();
            File.Delete(_scriptPath);
        }
    }

    private string ExitCode() => _process.HasExited ? _process.ExitCode.ToString(System.Globalization.CultureInfo.InvariantCulture) : "still running";
}
