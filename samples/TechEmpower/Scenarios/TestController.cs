using Microsoft.AspNetCore.Mvc;

namespace TechEmpower.Scenarios;

/// <summary>GET /api/test: the smallest MVC API action, as in the project templates of the time.</summary>
[Route("api/[controller]")]
public sealed class TestController : ControllerBase
{
    /// <summary>Returns <c>Test</c> and the current UTC time, written by the string output formatter.</summary>
    /// <returns>For example <c>Test 11/21/2026 20:56:00</c> (invariant culture).</returns>
    [HttpGet]
    public string Get() => $"Test {DateTime.UtcNow}";
}
